#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tf_fuzz::server::chat(data));
