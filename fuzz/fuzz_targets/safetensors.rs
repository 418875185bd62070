#![no_main]

// Counts the largest allocation, so the body can check the reader never allocates more than the file.
#[global_allocator]
static A: tf_testkit::alloc::Counting = tf_testkit::alloc::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| tf_fuzz::loader::safetensors(data));
