//! Running the server: a tokio runtime, an accept loop serving each connection with hyper's HTTP/1 (a header
//! read timeout that is also the idle keep-alive timeout, a cap on open connections answered with 503), signals
//! (SIGINT/SIGTERM: a bounded graceful shutdown; SIGHUP: the API key file re-read) and the live terminal line.

use crate::error::ApiError;
use crate::Shared;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
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
    /// Connection limits.
    pub conn: ConnLimits,
}

/// Limits on connections, enforced by hyper and the accept loop.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// A client must send a request's whole header within this long; it is also how long an idle keep-alive
    /// connection stays open. A connection over it is closed.
    pub header_timeout: Duration,
    /// Most connections served at once. More are answered with 503 (at most [`REFUSING_AT_ONCE`] being answered
    /// at a time; beyond that a new connection is closed unanswered) and closed.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits { header_timeout: Duration::from_secs(10), max_connections: 8192 }
    }
}

/// Connections over the cap that may be waiting for their 503 at once.
pub const REFUSING_AT_ONCE: usize = 256;
/// File descriptors kept free beside the connections (model files, the listener, logs, the runtime).
const FD_RESERVE: u64 = 256;

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
        #[cfg(unix)]
        if let Some(file) = state.cfg.keys.file().map(|f| f.display().to_string()) {
            let keys = state.cfg.keys.clone();
            tokio::spawn(async move {
                use tokio::signal::unix::{signal, SignalKind};
                let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
                while hup.recv().await.is_some() {
                    match keys.reload() {
                        Ok(n) => eprintln!("tensorfold: SIGHUP: {n} API keys loaded from {file}"),
                        Err(e) => eprintln!("tensorfold: SIGHUP: {e}; the keys in use are kept"),
                    }
                }
            });
        }
        let graceful = GracefulShutdown::new();
        let accepting = accept_loop(listener, state.clone(), opts.conn, stop_rx.clone(), &graceful);
        accepting.await;
        let mut hard = stop_rx;
        // Connections that never close (a client not reading) cannot hold the process past the bound.
        tokio::select! {
            _ = graceful.shutdown() => {}
            _ = async {
                let _ = hard.wait_for(|s| *s).await;
                tokio::time::sleep(timeout + Duration::from_secs(5)).await;
            } => {}
        }
        let failed = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        failed.map_or(Ok(()), |why| Err(format!("the engine failed: {why}")))
    });
    engine.cancel_all();
    engine.shutdown();
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Accepts connections until `stop` turns true, each served by hyper's HTTP/1 with the header timeout and
/// watched by `graceful`. Over `max_connections`, a connection gets a 503 in the route's error shape and is closed.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Shared,
    limits: ConnLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
    graceful: &GracefulShutdown,
) {
    let app = crate::router(state.clone());
    let max_connections = limits.max_connections.max(1);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let refusing = Arc::new(tokio::sync::Semaphore::new(REFUSING_AT_ONCE));
    let mut h1 = hyper::server::conn::http1::Builder::new();
    h1.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let mut refuse_h1 = h1.clone();
    refuse_h1.keep_alive(false);
    let mut last_accept_error = None::<std::time::Instant>;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of file descriptors or a connection reset before it was accepted: say so (at most once a
                // second) and go on; a short pause lets closing connections free descriptors.
                if last_accept_error.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    eprintln!("tensorfold: accepting a connection failed: {e}");
                    last_accept_error = Some(std::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let io = TokioIo::new(tcp);
        if let Ok(slot) = slots.clone().try_acquire_owned() {
            let conn = graceful.watch(h1.serve_connection(io, TowerToHyperService::new(app.clone())));
            let st = state.clone();
            st.connections_open.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let _ = conn.await;
                st.connections_open.fetch_sub(1, Ordering::Relaxed);
                drop(slot);
            });
        } else {
            state.connections_refused.fetch_add(1, Ordering::Relaxed);
            // Over the cap: a 503 when few are being refused, else the connection is dropped (closed) at once.
            let Ok(refusal) = refusing.clone().try_acquire_owned() else { continue };
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| async move {
                let e = ApiError::too_many_connections(max_connections);
                Ok::<_, std::convert::Infallible>(crate::error_for(req.uri().path(), e))
            });
            let conn = graceful.watch(refuse_h1.serve_connection(io, svc));
            tokio::spawn(async move {
                let _ = conn.await;
                drop(refusal);
            });
        }
    }
}

/// Raises the soft limit on open files toward the hard limit so that `max_connections` sockets fit; returns the
/// cap that fits the limit in force (`max_connections` itself when it fits).
pub fn fit_connection_cap(max_connections: usize) -> usize {
    let want = max_connections as u64 + REFUSING_AT_ONCE as u64 + FD_RESERVE;
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return max_connections;
        }
        if lim.rlim_cur < want as libc::rlim_t {
            let raised = libc::rlimit { rlim_cur: (want as libc::rlim_t).min(lim.rlim_max), rlim_max: lim.rlim_max };
            // SAFETY: as above.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                lim.rlim_cur = raised.rlim_cur;
            }
        }
        let room = lim.rlim_cur.saturating_sub(REFUSING_AT_ONCE as u64 + FD_RESERVE).max(1);
        (max_connections as u64).min(room) as usize
    }
    #[cfg(not(unix))]
    {
        let _ = want;
        max_connections
    }
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
