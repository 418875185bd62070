//! A small byte mutator for the stable replay (libFuzzer's mutations without its coverage feedback): bit flips,
//! byte sets, inserts, deletes, duplicated ranges, interesting integers, dictionary tokens, splices with another
//! seed and truncation, stacked 1 to 4 deep. Dictionaries are read from libFuzzer's `.dict` format, so the
//! cargo-fuzz runs and the replay share them.

use rand::Rng;

/// Integers that hit edges: zero, one, signed and unsigned limits, powers of two.
const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

/// Parses a libFuzzer dictionary: one `"token"` (optionally `name="token"`) per line, `#` comments, `\\`, `\"`
/// and `\xNN` escapes.
pub fn parse_dict(text: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(start) = line.find('"') else { continue };
        let Some(end) = line.rfind('"').filter(|&e| e > start) else { continue };
        let body = &line.as_bytes()[start + 1..end];
        let mut tok = Vec::with_capacity(body.len());
        let mut i = 0;
        while i < body.len() {
            match (body[i], body.get(i + 1)) {
                (b'\\', Some(b'x')) if i + 4 <= body.len() => {
                    let hex = std::str::from_utf8(&body[i + 2..i + 4]).ok();
                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(b) => tok.push(b),
                        None => tok.extend_from_slice(&body[i..i + 4]),
                    }
                    i += 4;
                }
                (b'\\', Some(&c)) => {
                    tok.push(c);
                    i += 2;
                }
                (c, _) => {
                    tok.push(c);
                    i += 1;
                }
            }
        }
        out.push(tok);
    }
    out
}

/// Mutates `data` in place with 1–4 stacked mutations, keeping it at most `max_len` bytes. `dict` tokens are
/// inserted or written over; `other` is a second seed to splice from.
pub fn mutate(rng: &mut impl Rng, data: &mut Vec<u8>, max_len: usize, dict: &[Vec<u8>], other: &[u8]) {
    for _ in 0..rng.gen_range(1..=4) {
        mutate_once(rng, data, dict, other);
    }
    data.truncate(max_len);
}

/// A random index below `n` (0 when `n` is 0).
fn at(rng: &mut impl Rng, n: usize) -> usize {
    if n == 0 {
        0
    } else {
        rng.gen_range(0..n)
    }
}

fn mutate_once(rng: &mut impl Rng, d: &mut Vec<u8>, dict: &[Vec<u8>], other: &[u8]) {
    let len = d.len();
    match rng.gen_range(0..11) {
        0 if len > 0 => {
            let i = at(rng, len);
            d[i] ^= 1 << rng.gen_range(0..8);
        }
        1 if len > 0 => {
            let i = at(rng, len);
            d[i] = rng.gen();
        }
        2 => {
            let i = at(rng, len + 1);
            let n = rng.gen_range(1..=8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            d.splice(i..i, bytes);
        }
        3 if len > 0 => {
            let i = at(rng, len);
            let n = rng.gen_range(1..=(len - i).min(16));
            d.drain(i..i + n);
        }
        4 if len > 0 => {
            // Duplicate a range somewhere else (repeats structure: array items, JSON members).
            let i = at(rng, len);
            let n = rng.gen_range(1..=(len - i).min(64));
            let piece = d[i..i + n].to_vec();
            let j = at(rng, len + 1);
            d.splice(j..j, piece);
        }
        5 | 6 => {
            let v = INTERESTING[rng.gen_range(0..INTERESTING.len())];
            let v = if rng.gen_bool(0.25) { v.wrapping_neg() } else { v };
            let width = [1usize, 2, 4, 8][rng.gen_range(0..4)];
            let bytes = &v.to_le_bytes()[..width];
            if len >= width && rng.gen_bool(0.7) {
                let i = at(rng, len - width + 1);
                d[i..i + width].copy_from_slice(bytes);
            } else {
                let i = at(rng, len + 1);
                d.splice(i..i, bytes.iter().copied());
            }
        }
        7 | 8 if !dict.is_empty() => {
            let tok = &dict[rng.gen_range(0..dict.len())];
            let i = at(rng, len + 1);
            if rng.gen_bool(0.5) || i + tok.len() > len {
                d.splice(i..i, tok.iter().copied());
            } else {
                d[i..i + tok.len()].copy_from_slice(tok);
            }
        }
        9 if !other.is_empty() => {
            // Splice: a prefix of this input with a suffix of the other.
            let i = at(rng, len + 1);
            let j = at(rng, other.len());
            d.truncate(i);
            d.extend_from_slice(&other[j..]);
        }
        10 if len > 0 => {
            let n = at(rng, len);
            d.truncate(n);
        }
        _ => {
            let i = at(rng, len + 1);
            d.insert(i, rng.gen());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn dictionaries_parse_like_libfuzzer() {
        let d = parse_dict("# c\n\"a\"\nkw=\"\\x00\\xff\\\"q\\\\\"\n\n\"{\\\"k\\\":\"\n");
        assert_eq!(d, vec![b"a".to_vec(), vec![0, 0xff, b'"', b'q', b'\\'], b"{\"k\":".to_vec()]);
    }

    #[test]
    fn mutations_stay_bounded_and_change_inputs() {
        let mut rng = StdRng::seed_from_u64(7);
        let dict = vec![b"null".to_vec()];
        let mut changed = 0;
        for _ in 0..2000 {
            let mut d = b"{\"a\": [1, 2, 3]}".to_vec();
            mutate(&mut rng, &mut d, 24, &dict, b"other seed");
            assert!(d.len() <= 24);
            changed += usize::from(d != b"{\"a\": [1, 2, 3]}");
        }
        assert!(changed > 1900, "{changed}");
        let mut empty = Vec::new();
        for _ in 0..100 {
            mutate(&mut rng, &mut empty, 8, &[], b"");
        }
    }
}
