//! A real-time TTS endpoint over WebSockets, rate-limited per API key.
//!
//! ```text
//! cargo run --release --example streaming_server --all-features -- --port 0
//! ```
//!
//! Prints the bound address, then serves until interrupted. See
//! `examples/support/streaming_app.rs` for the protocol and the budgets, and
//! `examples/streaming_client.rs` for a client that exercises them.

#[path = "support/streaming_app.rs"]
mod streaming_app;

use keyrate::MonotonicClock;
use streaming_app::{App, Limits};

#[tokio::main]
async fn main() {
    let port = match parse_port(std::env::args().skip(1)) {
        Ok(port) => port,
        Err(message) => {
            eprintln!("{message}\nusage: streaming_server [--port N]  (0 picks a free port)");
            std::process::exit(2);
        }
    };
    let limits = Limits::default();
    let app = App::new(limits, MonotonicClock::new());
    let addr = match streaming_app::spawn(&app, port).await {
        Ok(addr) => addr,
        Err(err) => {
            eprintln!("cannot listen on 127.0.0.1:{port}: {err}");
            std::process::exit(1);
        }
    };
    println!("listening on {addr}");
    println!("  ws://{addr}/v1/stream   (WebSocket; Authorization: Bearer <key> or X-API-Key)");
    println!("  http://{addr}/v1/tts    (POST text; costs its length)");
    println!("  http://{addr}/metrics   (Prometheus text: counters, top offenders, responses)");
    println!(
        "  http://{addr}/admin/plans/{{free,pro}}  (PUT JSON quotas, X-Admin-Token: {}; GET /admin/plans)",
        app.admin_token
    );
    println!("  plans: sk_pro_* keys are on pro (5x bursts, 10x rates), other keys on free");
    println!(
        "  per key: connections+contexts {} burst, {}/s; synthesis {} chars burst, {} chars/s; \
         closed (1008) after {} ignored retry_afters",
        limits.connect_burst,
        limits.connect_rate,
        limits.synth_burst,
        limits.synth_rate,
        limits.max_strikes
    );
    if tokio::signal::ctrl_c().await.is_ok() {
        println!("shutting down");
    }
}

/// Reads `--port N` (or `--port=N`); the default is 0 (pick a free port).
fn parse_port(mut args: impl Iterator<Item = String>) -> Result<u16, String> {
    let mut port = 0;
    while let Some(arg) = args.next() {
        let value = match arg.strip_prefix("--port") {
            Some("") => args.next().ok_or("--port needs a value")?,
            Some(rest) if rest.starts_with('=') => rest[1..].to_owned(),
            _ => return Err(format!("unknown argument {arg:?}")),
        };
        port = value
            .parse()
            .map_err(|_| format!("invalid port {value:?}: expected 0 to 65535"))?;
    }
    Ok(port)
}
