//! The stable form of a fuzz run: every seed of `fuzz/seeds/<target>/`, then a fixed number of random mutations
//! of them (count-bounded, so its cost does not depend on the machine). The mutation seed is fixed per target, so
//! a run repeats exactly; `TF_FUZZ_SEED=<n>` picks another, `TF_FUZZ_SEED=fresh` a new one each run (printed), and
//! `TF_FUZZ_ITERS` changes the count. An input that fails is written to
//! the temporary directory and the panic names the file (`cargo fuzz run <target> <file>` replays it too).

use crate::mutate::{mutate, parse_dict};
use crate::Target;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// What a replay ran.
#[derive(Debug, Clone, Copy)]
pub struct Replayed {
    pub seeds: usize,
    pub mutations: usize,
}

/// The seed corpus of `target`, sorted by file name.
pub fn seeds(target: &Target) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = crate::fuzz_dir().join("seeds").join(target.name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))))
        .collect()
}

/// The dictionary of `target`.
pub fn dict(target: &Target) -> Vec<Vec<u8>> {
    let path = crate::fuzz_dir().join("dict").join(target.dict);
    parse_dict(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|s| s.trim().parse().unwrap_or_else(|_| panic!("{name} must be an integer")))
}

/// Runs `input` through the target; a panic is re-raised naming the saved input.
fn run_one(target: &Target, input: &[u8], what: &str, seed: u64) {
    if catch_unwind(AssertUnwindSafe(|| (target.run)(input))).is_ok() {
        return;
    }
    let name = format!("tf-fuzz-{}-{:016x}", target.name, fnv(input));
    let path = std::env::temp_dir().join(name);
    let saved = match std::fs::write(&path, input) {
        Ok(()) => format!("saved as {}", path.display()),
        Err(e) => format!("could not be saved ({e})"),
    };
    panic!(
        "fuzz target `{}` failed on {what} (TF_FUZZ_SEED={seed}); the input ({} bytes) {saved}",
        target.name,
        input.len()
    );
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3))
}

/// Replays the seeds of `target`, then `iters` mutations (or `TF_FUZZ_ITERS`).
pub fn replay(target: &Target, iters: usize) -> Replayed {
    let seeds = seeds(target);
    assert!(!seeds.is_empty(), "fuzz/seeds/{} holds no seeds", target.name);
    let seed = match std::env::var("TF_FUZZ_SEED").ok().as_deref().map(str::trim) {
        None | Some("") => fnv(target.name.as_bytes()),
        Some("fresh") => {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        }
        Some(s) => s.parse().unwrap_or_else(|_| panic!("TF_FUZZ_SEED must be an integer or `fresh`")),
    };
    let iters = env_u64("TF_FUZZ_ITERS").map_or(iters, |n| n as usize);
    eprintln!("fuzz replay `{}`: {} seeds, {iters} mutations, TF_FUZZ_SEED={seed}", target.name, seeds.len());
    for (path, bytes) in &seeds {
        run_one(target, bytes, &format!("seed {}", path.display()), seed);
    }
    let dict = dict(target);
    let mut rng = StdRng::seed_from_u64(seed);
    // Mutants are mutated further now and then (depth without coverage feedback).
    let mut pool: Vec<Vec<u8>> = Vec::new();
    for i in 0..iters {
        let mut input = match pool.len() {
            n if n > 0 && rng.gen_bool(0.3) => pool[rng.gen_range(0..n)].clone(),
            _ => seeds[rng.gen_range(0..seeds.len())].1.clone(),
        };
        let other = &seeds[rng.gen_range(0..seeds.len())].1;
        mutate(&mut rng, &mut input, target.max_len, &dict, other);
        run_one(target, &input, &format!("mutation #{i}"), seed);
        if pool.len() < 64 {
            pool.push(input);
        } else {
            let k = rng.gen_range(0..pool.len());
            pool[k] = input;
        }
    }
    Replayed { seeds: seeds.len(), mutations: iters }
}
