//! A real-time TTS endpoint over WebSockets, rate-limited per API key.
//!
//! ```text
//! KEYRATE_ADMIN_TOKEN=... KEYRATE_KEY_LABEL_SECRET=... \
//!     cargo run --release --example streaming_server --all-features -- --port 0
//! ```
//!
//! Prints the bound address, then serves until interrupted. See
//! `examples/support/streaming_app.rs` for the protocol and the budgets, and
//! `examples/streaming_client.rs` for a client that exercises them.
//!
//! Configuration, from the environment (or flags, which other users of
//! the machine can read in the process list):
//!
//! - `KEYRATE_ADMIN_TOKEN` (`--admin-token`): the token of the admin
//!   routes; unset, they are off.
//! - `KEYRATE_KEY_LABEL_SECRET`: the secret of the key fingerprints that
//!   `/metrics` shows (give every server of a fleet the same one); unset,
//!   a random one per process. `--key-label KEY` prints KEY's label under
//!   it and exits.

#[path = "support/streaming_app.rs"]
mod streaming_app;

use keyrate::{KeyLabels, MonotonicClock};
use streaming_app::{App, Limits};

const USAGE: &str = "usage: streaming_server [--port N] [--admin-token TOKEN] [--key-label KEY]  \
                     (port 0 picks a free port)";

#[tokio::main]
async fn main() {
    let config = match Config::parse(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("{message}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Ok(secret) = std::env::var("KEYRATE_KEY_LABEL_SECRET") {
        KeyLabels::set_default_secret(secret.as_bytes());
    }
    if let Some(key) = config.key_label {
        println!("{}", KeyLabels::fingerprint().label(&key));
        return;
    }
    let admin_token = config
        .admin_token
        .or_else(|| std::env::var("KEYRATE_ADMIN_TOKEN").ok());
    let limits = Limits::default();
    let app = App::new(limits, MonotonicClock::new()).with_admin_token(admin_token.as_deref());
    let port = config.port;
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
    println!("  http://{addr}/metrics   (Prometheus text: counters, top offenders by fingerprint, streams, responses)");
    if app.admin_routes() {
        println!(
            "  http://{addr}/admin/plans[/{{free,pro}}]  (GET / PUT JSON quotas; X-Admin-Token from the configuration)"
        );
    } else {
        println!("  admin routes off (set KEYRATE_ADMIN_TOKEN to turn them on)");
    }
    println!(
        "  plans: sk_pro_* keys are on pro (5x bursts, 10x rates and streams), other keys on free"
    );
    println!(
        "  per key: {} streams open at once; connections+contexts {} burst, {}/s; \
         synthesis {} chars burst, {} chars/s; closed (1008) after {} ignored retry_afters; \
         at most {} buckets per budget",
        limits.max_streams,
        limits.connect_burst,
        limits.connect_rate,
        limits.synth_burst,
        limits.synth_rate,
        limits.max_strikes,
        limits.max_buckets
    );
    if tokio::signal::ctrl_c().await.is_ok() {
        println!("shutting down");
    }
}

/// The command line.
#[derive(Default)]
struct Config {
    /// `--port N` (or `--port=N`); 0 (the default) picks a free port.
    port: u16,
    /// `--admin-token TOKEN`.
    admin_token: Option<String>,
    /// `--key-label KEY`: print KEY's label and exit.
    key_label: Option<String>,
}

impl Config {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Config, String> {
        let mut config = Config::default();
        while let Some(arg) = args.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                None => (arg.clone(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or(format!("{name} needs a value"))
            };
            match name.as_str() {
                "--port" => {
                    let port = value()?;
                    config.port = port
                        .parse()
                        .map_err(|_| format!("invalid port {port:?}: expected 0 to 65535"))?;
                }
                "--admin-token" => config.admin_token = Some(value()?),
                "--key-label" => config.key_label = Some(value()?),
                _ => return Err(format!("unknown argument {arg:?}")),
            }
        }
        Ok(config)
    }
}
