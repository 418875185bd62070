//! The `trace` feature: every named intermediate reaches the hook (`cargo test -p tf-models --features trace`).

use crate::common::{hf_model, run_chunked};
use crate::naive::Naive;
use std::sync::{Arc, Mutex};
use tf_models::layers::{set_trace_hook, NO_LAYER};

#[test]
fn hook_sees_named_intermediates() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    set_trace_hook(Some(Box::new(move |name, layer, t| sink.lock().unwrap().push((name.to_owned(), layer, t.rows)))));
    let model = hf_model(&Naive, &tf_testkit::repo_root().join("fixtures/tiny/gemma3"));
    run_chunked(&Naive, model.as_ref(), &[2, 17, 203], &[3]);
    set_trace_hook(None);
    let seen = seen.lock().unwrap();
    for (name, layer) in
        [("inp_scaled", NO_LAYER), ("q_normed", 0), ("attn_post_norm", 1), ("l_out", 1), ("result_output", NO_LAYER)]
    {
        assert!(
            seen.iter().any(|(n, l, rows)| n == name && *l == layer && *rows == 3),
            "{name} of layer {layer} not traced"
        );
    }
}
