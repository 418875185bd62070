//! The keyed RNG of DESIGN.md §3, bit-compatible with the published TensorFold rule (`exact_sampling.py`):
//! a uniform in (0, 1) for each (seed, absolute position, token id), with no state. Because a draw depends only
//! on its key, a verify row, a serial decode step and a draft proposal at the same position all see the same
//! noise.

use sha2::{Digest, Sha256};

/// The salt of the published rule's default (`TENSORFOLD_SEED_SALT` unset = integer 0, written `|0`).
pub const DEFAULT_SEED_SALT: &str = "0";

/// The splitmix64 finalizer (wrapping u64 arithmetic).
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z ^= z >> 30;
    z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^= z >> 27;
    z = z.wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The uniform for (`seed`, `position`, `token_id`): `(x >> 11)·2^-53 + 2^-54`, in (0, 1] — the one value
/// `x >> 11 == 2^53 − 1` rounds to exactly 1.0 in f64 (probability 2^-53), in the published rule too.
///
/// `x = mix(seed + φ); x = mix(x ^ position·0xD1B54A32D192ED03); x = mix(x ^ token_id)`, all wrapping;
/// `u = (x >> 11)·2^-53 + 2^-54`. `position` is the absolute position of the token being sampled.
#[inline]
pub fn uniform(seed: u64, position: u64, token_id: u32) -> f64 {
    let mut x = mix(seed.wrapping_add(0x9E37_79B9_7F4A_7C15));
    x = mix(x ^ position.wrapping_mul(0xD1B5_4A32_D192_ED03));
    x = mix(x ^ u64::from(token_id));
    // (x >> 11) < 2^53: exact in f64; the scale and the offset are powers of two, so both steps are exact.
    (x >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0) + (1.0 / 18_014_398_509_481_984.0)
}

/// A request's seed when it gives none: SHA-256 of the prompt ids in decimal joined by `,`, then `|` and `salt`;
/// the first 8 digest bytes little-endian, masked to 63 bits. The published default salt is
/// [`DEFAULT_SEED_SALT`] (`"0"`).
pub fn derive_seed(prompt_ids: &[u32], salt: &str) -> u64 {
    let mut h = Sha256::new();
    for (i, id) in prompt_ids.iter().enumerate() {
        if i > 0 {
            h.update(b",");
        }
        h.update(id.to_string().as_bytes());
    }
    h.update(b"|");
    h.update(salt.as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first) & ((1u64 << 63) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values computed independently of this code, from the published definition, by this Python
    // one-off (Python 3, arbitrary-precision ints masked to u64):
    //
    //   import hashlib
    //   M = (1 << 64) - 1
    //   def mix(z):
    //       z ^= z >> 30; z = (z * 0xBF58476D1CE4E5B9) & M
    //       z ^= z >> 27; z = (z * 0x94D049BB133111EB) & M
    //       return z ^ (z >> 31)
    //   def uniform(seed, pos, tok):
    //       x = mix((seed + 0x9E3779B97F4A7C15) & M)
    //       x = mix(x ^ ((pos * 0xD1B54A32D192ED03) & M))
    //       x = mix(x ^ tok)
    //       return (x >> 11) * 2.0**-53 + 2.0**-54
    //   def seed_for(ids, salt):
    //       d = hashlib.sha256((",".join(str(t) for t in ids) + "|" + salt).encode()).digest()
    //       return int.from_bytes(d[:8], "little") & ((1 << 63) - 1)
    //
    // Output:
    //   mix 0x0 0x0
    //   mix 0x1 0x5692161d100b05e5
    //   mix 0x9e3779b97f4a7c15 0xe220a8397b1dcdaf      (the well-known first splitmix64 output for seed 0)
    //   mix 0xffffffffffffffff 0xb4d055fcf2cbbd7b
    //   uniform 0 0 0 0.20310281705476102 0x1.9ff45ea7ce2bep-3
    //   uniform 42 7 1234 0.10471401096148109 0x1.ace8994833644p-4
    //   uniform 18446744073709551615 123456 151935 0.15975660866321856 0x1.472e790c3a26ap-3
    //   uniform 1234 1099511627776 3 0.010535023752482331 0x1.59362f3d60160p-7
    //   seed [] '' 2961153575210706379
    //   seed [] '0' 6024232415158801135
    //   seed [1, 2, 3] '0' 2418267834652783048
    //   seed [1, 2, 3] '' 7429073718786099854
    //   seed [9707, 11, 1879] 'salt' 3647664684694871140

    #[test]
    fn mix_known_answers() {
        assert_eq!(mix(0), 0);
        assert_eq!(mix(1), 0x5692_161d_100b_05e5);
        assert_eq!(mix(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix(u64::MAX), 0xb4d0_55fc_f2cb_bd7b);
    }

    #[test]
    fn uniform_known_answers() {
        // Python's repr is the shortest round-trip decimal, so parsing it gives the exact bits.
        let cases: [(u64, u64, u32, f64); 4] = [
            (0, 0, 0, 0.20310281705476102),
            (42, 7, 1234, 0.10471401096148109),
            (u64::MAX, 123456, 151935, 0.15975660866321856),
            (1234, 1 << 40, 3, 0.010535023752482331),
        ];
        for (seed, pos, tok, want) in cases {
            assert_eq!(uniform(seed, pos, tok).to_bits(), want.to_bits(), "uniform({seed}, {pos}, {tok})");
        }
    }

    #[test]
    fn uniform_range() {
        // x >> 11 == 0 gives 2^-54 > 0. x >> 11 == 2^53 - 1 gives 1 - 2^-54, which is not an f64: it rounds
        // (to even) to exactly 1.0, in the published NumPy rule as here (see `uniform`'s docs).
        let lo = 0.0 * (1.0 / 9_007_199_254_740_992.0) + (1.0 / 18_014_398_509_481_984.0);
        let hi = ((1u64 << 53) - 1) as f64 * (1.0 / 9_007_199_254_740_992.0) + (1.0 / 18_014_398_509_481_984.0);
        assert!(lo > 0.0);
        assert_eq!(hi, 1.0);
        for pos in 0..2000u64 {
            let u = uniform(7, pos, (pos * 31) as u32);
            assert!(u > 0.0 && u < 1.0);
        }
    }

    #[test]
    fn derive_seed_known_answers() {
        assert_eq!(derive_seed(&[], ""), 2961153575210706379);
        assert_eq!(derive_seed(&[], "0"), 6024232415158801135);
        assert_eq!(derive_seed(&[1, 2, 3], DEFAULT_SEED_SALT), 2418267834652783048);
        assert_eq!(derive_seed(&[1, 2, 3], ""), 7429073718786099854);
        assert_eq!(derive_seed(&[9707, 11, 1879], "salt"), 3647664684694871140);
        assert!(derive_seed(&[5; 100], "x") < 1 << 63);
    }
}
