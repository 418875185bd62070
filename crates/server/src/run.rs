//! Running the server: a tokio runtime around the router, signals, a bounded graceful shutdown and the live
//! terminal line.

use crate::Shared;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How to run.
pub struct ServeOptions {
    /// Where to listen (`port` 0 lets the OS pick; the address in use goes to `on_ready`).
    pub addr: SocketAddr,
    /// After SIGINT/SIGTERM, running requests get this long to finish before they are cancelled.
    pub shutdown_timeout: Duration,
    /// Called once the socket is bound, with the address in use.
    pub on_ready: Box<dyn FnOnce(SocketAddr) + Send>,
    /// Keep one live throughput line on stderr (only when stderr is a terminal).
    pub live_line: bool,
}

/// Serves until SIGINT or SIGTERM, then stops accepting, lets running requests finish for up to
/// `shutdown_timeout`, cancels the rest, and joins the engine thread. If the engine fails (its thread panicked)
/// the server stops the same way and the result is an error saying why.
pub fn serve_blocking(state: Shared, opts: ServeOptions) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tensorfold-http")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let engine = state.engine.clone();
    let result = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(opts.addr)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", opts.addr))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        (opts.on_ready)(local);
        if opts.live_line && std::io::stderr().is_terminal() {
            tokio::spawn(live_line(state.clone()));
        }
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stop_on_failure = stop_tx.clone();
        let engine = state.engine.clone();
        let timeout = opts.shutdown_timeout;
        tokio::spawn(async move {
            wait_for_signal().await;
            eprintln!(
                "\ntensorfold: shutting down: no new requests; running ones get {}s to finish (signal again to \
                 cancel them now)",
                timeout.as_secs()
            );
            engine.stop_accepting();
            let _ = stop_tx.send(true);
            tokio::select! {
                _ = tokio::time::sleep(timeout) => {}
                _ = wait_for_signal() => {}
            }
            engine.cancel_all();
        });
        // The engine failing (its thread panicked: every request it held got an error) stops the server too, and
        // `serve` exits non-zero, so a supervisor restarts it instead of routing requests to a server that can
        // only refuse them.
        let failed = Arc::new(Mutex::new(None::<String>));
        {
            let (engine, failed, stop_tx) = (state.engine.clone(), failed.clone(), stop_on_failure);
            tokio::spawn(async move {
                let ended = tokio::task::spawn_blocking(move || engine.wait_end()).await;
                if let Ok(Some(why)) = ended {
                    eprintln!("\ntensorfold: the engine failed: {why}; stopping the server");
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                    let _ = stop_tx.send(true);
                }
            });
        }
        let app = crate::router(state.clone());
        let mut graceful = stop_rx.clone();
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = graceful.wait_for(|s| *s).await;
        });
        let mut hard = stop_rx;
        let served = tokio::select! {
            r = server => r.map_err(|e| format!("server error: {e}")),
            // Connections that never close (a client not reading) cannot hold the process past the bound.
            _ = async {
                let _ = hard.wait_for(|s| *s).await;
                tokio::time::sleep(timeout + Duration::from_secs(5)).await;
            } => Ok(()),
        };
        let failed = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        served.and(failed.map_or(Ok(()), |why| Err(format!("the engine failed: {why}"))))
    });
    engine.cancel_all();
    engine.shutdown();
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
            (Ok(mut i), Ok(mut t)) => {
                tokio::select! {
                    _ = i.recv() => {}
                    _ = t.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn live_line(state: Shared) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let s = state.engine.stats();
        let used = s.kv_blocks_used.load(Ordering::Relaxed);
        let total = s.kv_blocks_total.load(Ordering::Relaxed).max(1);
        let line = format!(
            "running {} · waiting {} · {:.1} tok/s · {} requests done · {} tokens out · KV {}%",
            s.running.load(Ordering::Relaxed),
            s.waiting.load(Ordering::Relaxed),
            s.live_decode_milli_tps.load(Ordering::Relaxed) as f64 / 1000.0,
            s.finished_total(),
            s.generation_tokens.load(Ordering::Relaxed),
            used * 100 / total,
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
    }
}
