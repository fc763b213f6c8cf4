//! The admin server's connections, each bounded: at most `[admin] max_connections`
//! open at once (one more is closed at once, so the process's file descriptors stay
//! for the engine: broker sockets, receiver calls, store files), a request's head
//! read within `header_timeout` (which also ends a keep-alive connection idle that
//! long), and a connection cut when it outlives `max_connection_age` (a client that
//! stops reading a large answer would otherwise hold it forever). Every request
//! carries the peer's address (`ConnectInfo`) for the limits on failed credentials.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tracing::{debug, warn};

use crate::metrics::names;

/// How the admin server bounds its connections (`[admin]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// How long a request's head may take to arrive, and a keep-alive connection may idle.
    pub header_timeout: Duration,
    /// How long a connection may stay open at all.
    pub max_age: Duration,
}

/// How long the connections still open at shutdown get to finish their request.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A failed `accept` (out of file descriptors, most often) is tried again after this,
/// so that a full table does not spin the loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown`, then lets open requests finish
/// (for at most [`SHUTDOWN_GRACE`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let stop = CancellationToken::new();
    let mut open = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = open.join_next() => continue,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(error) => {
                warn!(%error, "the admin server could not accept a connection; trying again");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Closed at once: its descriptor is given back now, and the client is told
            // by the closed connection rather than left waiting in the backlog.
            metrics::counter!(names::ADMIN_CONNECTIONS_REFUSED).increment(1);
            debug!(%peer, max_connections = limits.max_connections, "admin connection refused: too many open");
            drop(stream);
            continue;
        };
        metrics::gauge!(names::ADMIN_CONNECTIONS).increment(1.0);
        open.spawn(connection(stream, peer, app.clone(), limits, stop.clone(), slot));
    }
    stop.cancel();
    while open.join_next().await.is_some() {}
    Ok(())
}

/// One connection, to its end, its limit of age, or the server's shutdown.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        app.clone().oneshot(request)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => Some(ended),
        () = tokio::time::sleep(limits.max_age) => {
            debug!(%peer, max_age = ?limits.max_age, "admin connection closed: open too long");
            None
        }
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(SHUTDOWN_GRACE, conn.as_mut()).await.ok()
        }
    };
    if let Some(Err(error)) = ended {
        // A client that went away or sent garbage: its own business.
        debug!(%peer, %error, "admin connection ended with an error");
    }
    metrics::gauge!(names::ADMIN_CONNECTIONS).decrement(1.0);
    drop(slot);
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// A server with `max` connections and a 300 ms head timeout, answering `/healthz`.
    async fn server(max: usize) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/healthz", get(|| async { "ok" }));
        let limits = Limits {
            max_connections: max,
            header_timeout: Duration::from_millis(300),
            max_age: Duration::from_secs(60),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, app, limits, async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// Waits until the server closes `s` (end of stream or reset); false if it did not within `within`.
    async fn closed(s: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 256];
        loop {
            match tokio::time::timeout(within, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    async fn healthz(addr: SocketAddr) -> Option<String> {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.ok()?;
        Some(answer)
    }

    // The bounds are far above the timeout: what is asserted is that the server closes
    // what it must, not how fast.
    const WITHIN: Duration = Duration::from_secs(10);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_sent_and_idle_connections_are_closed_after_the_head_timeout() {
        let (addr, _stop) = server(16).await;
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /healthz HTT").await.unwrap();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut kept = TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 256];
        let n = kept.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"), "the first request is answered");
        for (s, what) in
            [(&mut half, "half a request line"), (&mut silent, "nothing"), (&mut kept, "a keep-alive idle")]
        {
            assert!(closed(s, WITHIN).await, "a connection that sent {what} was left open");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_past_the_bound_are_closed_at_once_and_health_answers_once_idle_ones_end() {
        let (addr, _stop) = server(4).await;
        let mut idle = Vec::new();
        for _ in 0..4 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /healthz HTT").await.unwrap();
            idle.push(s);
        }
        // Give the server the time to accept the four before the fifth comes.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut over = TcpStream::connect(addr).await.unwrap();
        assert!(closed(&mut over, Duration::from_millis(250)).await, "the connection past the bound was kept");
        let started = Instant::now();
        loop {
            if healthz(addr).await.is_some_and(|a| a.starts_with("HTTP/1.1 200")) {
                break;
            }
            assert!(started.elapsed() < WITHIN, "/healthz never answered again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
