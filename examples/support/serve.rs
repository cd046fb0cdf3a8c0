//! Serving the app on a socket, with the bounds an unauthenticated client
//! meets before any route: at most `max_connections` connections open at
//! once (one more is closed as soon as it is accepted), and a request head
//! that must arrive whole within `header_timeout` (an idle keep-alive
//! connection too). Without them, connections that trickle a head byte by
//! byte, or send nothing, are held forever, each with its task and buffers:
//! memory without bound, and no key needed.

use super::App;
use axum::extract::ConnectInfo;
use axum::Extension;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::Layer;

/// Binds `127.0.0.1:port` (0 picks a free port) and serves the app in a
/// background task, with each connection's peer address (for the
/// failed authentications' limit); returns the bound address.
pub async fn spawn(app: &App, port: u16) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let router = app.router();
    let open = Arc::new(Semaphore::new(app.limits.max_connections));
    let header_timeout = app.limits.header_timeout;
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                // Out of file descriptors, or a connection gone before it
                // was accepted: try again shortly.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            // At the cap: closed before a byte is read.
            let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
                continue;
            };
            let service = Extension(ConnectInfo(peer)).layer(router.clone());
            tokio::spawn(async move {
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .with_upgrades();
                let _ = connection.await;
                // A WebSocket's socket lives on in its own task, held by
                // its streams permit; the connection slot is free.
                drop(permit);
            });
        }
    });
    Ok(addr)
}
