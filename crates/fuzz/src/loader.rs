//! The checkpoint readers on arbitrary bytes.

use crate::check_message;
use std::path::Path;
use tf_core::WeightsError;
use tf_loader::{gguf, safetensors};

/// What reading a header may allocate at most in one piece for an `n`-byte file (the readers' promise: no
/// allocation larger than the file; 64 KiB of slack for fixed-size tables). Measured only where the binary's
/// global allocator is [`tf_testkit::alloc::Counting`].
fn alloc_bound(n: usize) -> usize {
    n + (64 << 10)
}

fn check_weights_error(e: &WeightsError) {
    check_message("reader error", &e.problem);
    check_message("reader error", &e.to_string());
}

/// A GGUF file: the header, then (when it opens) the model configuration and the tokenizer its metadata
/// describe, as loading a model reads them.
pub fn gguf(data: &[u8]) {
    let (parsed, largest) = tf_testkit::alloc::largest_allocation(|| gguf::parse_header(data, "fuzz.gguf"));
    assert!(largest <= alloc_bound(data.len()), "an allocation of {largest} bytes for a {}-byte file", data.len());
    let h = match parsed {
        Ok(h) => h,
        Err(e) => return check_weights_error(&e),
    };
    assert!(h.alignment.is_power_of_two());
    assert_eq!(h.data_start % h.alignment, 0);
    let mut spans = Vec::new();
    for t in &h.tensors {
        let shape: Vec<u64> = t.ne.iter().rev().copied().collect();
        assert_eq!(t.info.shape, shape, "{}: shape is ne reversed", t.info.name);
        assert_eq!(t.offset % h.alignment, 0, "{}: offset aligned", t.info.name);
        let start = h.data_start + t.offset;
        let end = start + t.info.nbytes();
        assert!(end <= data.len() as u64, "{}: data [{start}, {end}) past the {}-byte file", t.info.name, data.len());
        spans.push((start, end));
    }
    spans.sort_unstable();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "tensor data overlaps: {spans:?}");

    // The model configuration (what `load_model` reads first).
    let (_, largest) = tf_testkit::alloc::largest_allocation(|| match tf_models::family_for_config(&h.metadata) {
        Ok(family) => match tf_models::ModelConfig::from_view(&h.metadata, family) {
            Ok(c) => assert_eq!(c.windows.len(), c.layers),
            Err(e) => check_message("model config error", &e.to_string()),
        },
        Err(e) => check_message("model family error", &e.to_string()),
    });
    assert!(largest <= alloc_bound(data.len()), "reading the config allocated {largest} bytes at once");

    // The tokenizer, when the metadata has one.
    if h.metadata.get("tokenizer.ggml.model").is_none() {
        return;
    }
    let tok = match tf_cli::gguf_text::tokenizer_from_gguf(&h.metadata) {
        Ok(t) => t,
        Err(e) => return check_message("tokenizer error", &e),
    };
    let vocab = tok.vocab_size();
    for text in ["Hello, world! 123", " <|im_start|>x\n\u{2581}é🦀", ""] {
        for (add, special) in [(false, false), (true, true)] {
            match tok.encode(text, add, special) {
                Ok(ids) => {
                    assert!(ids.iter().all(|&id| (id as usize) < vocab), "an id outside the vocabulary of {vocab}");
                    if let Err(e) = tok.decode(&ids, false) {
                        check_message("decode error", &e.to_string());
                    }
                }
                Err(e) => check_message("encode error", &e.to_string()),
            }
        }
    }
}

/// A safetensors file's header.
pub fn safetensors(data: &[u8]) {
    let path = Path::new("fuzz.safetensors");
    let (parsed, largest) = tf_testkit::alloc::largest_allocation(|| safetensors::parse_header(path, data));
    assert!(largest <= alloc_bound(data.len()), "an allocation of {largest} bytes for a {}-byte file", data.len());
    let h = match parsed {
        Ok(h) => h,
        Err(e) => return check_weights_error(&e),
    };
    let header_len = u64::from_le_bytes(data[..8].try_into().expect("8 bytes")) as usize;
    assert_eq!(h.data_start, 8 + header_len);
    assert_eq!(h.tensors.len(), h.ranges.len());
    let mut names = std::collections::HashSet::new();
    let mut prev_end = h.data_start;
    for (t, r) in h.tensors.iter().zip(&h.ranges) {
        assert!(names.insert(t.name.as_str()), "{}: listed twice", t.name);
        assert!(r.start >= h.data_start && r.start <= r.end && r.end <= data.len(), "{}: {r:?} outside", t.name);
        assert_eq!((r.end - r.start) as u64, t.nbytes(), "{}: range length", t.name);
        if !r.is_empty() {
            assert!(r.start >= prev_end, "{}: {r:?} overlaps the tensor before", t.name);
            prev_end = r.end;
        }
    }
}
