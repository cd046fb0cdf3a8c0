//! A real-time TTS endpoint over WebSockets, for the customers of a key
//! table, rate-limited per customer and per organization.
//!
//! ```text
//! KEYRATE_KEY_TABLE=keys.txt KEYRATE_ADMIN_TOKEN=... KEYRATE_METRICS_TOKEN=... \
//! KEYRATE_KEY_LABEL_SECRET=... \
//!     cargo run --release --example streaming_server --all-features -- --port 0
//! cargo run --release --example streaming_server --all-features -- --port 0 --demo
//! ```
//!
//! Prints the bound address, then serves until interrupted. See
//! `examples/support/streaming_app.rs` for the protocol and the budgets, and
//! `examples/streaming_client.rs` for a client that exercises them.
//!
//! Configuration, from the environment (or flags, which other users of
//! the machine can read in the process list):
//!
//! - `KEYRATE_KEY_TABLE` (`--keys FILE`): the API keys, one a line,
//!   `key customer org plan` (plan `free` or `pro`; `#` starts a comment).
//!   Unset, the server refuses to start, unless `--demo` asks for the
//!   built-in demo table of public keys (`sk_agent_demo`, ...), printed
//!   at start: for trying the example on this machine only.
//! - `KEYRATE_ADMIN_TOKEN` (`--admin-token`): the token of the admin
//!   routes, at least 16 bytes (a shorter one is refused); unset, they
//!   are off.
//! - `KEYRATE_METRICS_TOKEN`: the bearer token of `/metrics`, at least
//!   16 bytes; unset, it is off. A wrong route token is a failed
//!   authentication of the client's address, as an unknown API key is.
//! - `KEYRATE_KEY_LABEL_SECRET`: the secret of the customer id
//!   fingerprints that `/metrics` shows (give every server of a fleet the
//!   same one); unset, a random one per process. `--key-label ID` prints
//!   the label of customer ID under it and exits.

#[path = "support/streaming_app.rs"]
mod streaming_app;

use keyrate::{KeyLabels, MonotonicClock};
use streaming_app::{App, KeyTable, Limits, DEMO_KEYS, MIN_TOKEN_LEN};

const USAGE: &str = "usage: streaming_server [--port N] [--keys FILE] [--admin-token TOKEN] \
                     [--key-label CUSTOMER_ID] [--demo]  (port 0 picks a free port)";

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
        // A short secret would let anyone who reads /metrics invert the
        // labels of short keys (and of the addresses of failed logins).
        if let Err(error) = KeyLabels::set_default_secret(secret.as_bytes()) {
            eprintln!("KEYRATE_KEY_LABEL_SECRET: {error}");
            std::process::exit(2);
        }
    }
    if let Some(id) = config.key_label {
        println!("{}", KeyLabels::fingerprint().label(&id));
        return;
    }
    let table = config
        .keys
        .or_else(|| std::env::var("KEYRATE_KEY_TABLE").ok());
    let (text, demo) = match &table {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => (text, false),
            Err(err) => {
                eprintln!("cannot read the key table {path}: {err}");
                std::process::exit(2);
            }
        },
        None if config.demo => (DEMO_KEYS.to_owned(), true),
        None => {
            eprintln!(
                "no key table: give --keys FILE or KEYRATE_KEY_TABLE, or --demo for the \
                 built-in table of public demo keys (never deploy it)\n{USAGE}"
            );
            std::process::exit(2);
        }
    };
    let keys = match KeyTable::parse(&text, &["free", "pro"]) {
        Ok(keys) => keys,
        Err(message) => {
            eprintln!("the key table: {message}");
            std::process::exit(2);
        }
    };
    // Empty is unset: the route is off, as before.
    let admin_token = config
        .admin_token
        .or_else(|| std::env::var("KEYRATE_ADMIN_TOKEN").ok())
        .filter(|t| !t.is_empty());
    let metrics_token = std::env::var("KEYRATE_METRICS_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    for (name, token) in [("admin", &admin_token), ("metrics", &metrics_token)] {
        if token.as_ref().is_some_and(|t| t.len() < MIN_TOKEN_LEN) {
            // A short token is guessed: refused, not quietly turned off.
            eprintln!("the {name} token is under {MIN_TOKEN_LEN} bytes: use a random one");
            std::process::exit(2);
        }
    }
    let limits = Limits::default();
    let app = App::new(limits, keys.clone(), MonotonicClock::new())
        .with_admin_token(admin_token.as_deref())
        .with_metrics_token(metrics_token.as_deref());
    let port = config.port;
    let addr = match streaming_app::spawn(&app, port).await {
        Ok(addr) => addr,
        Err(err) => {
            eprintln!("cannot listen on 127.0.0.1:{port}: {err}");
            std::process::exit(1);
        }
    };
    println!("listening on {addr}");
    if demo {
        println!("  DEMO KEY TABLE (built in, public: never deploy it; set KEYRATE_KEY_TABLE):");
        for line in DEMO_KEYS.lines() {
            println!("    {line}");
        }
    } else {
        println!("  {} keys from the key table", keys.len());
    }
    println!("  ws://{addr}/v1/stream   (WebSocket; Authorization: Bearer <key> or X-API-Key)");
    println!("  http://{addr}/v1/tts    (POST text with a Content-Length; costs its length)");
    if app.metrics_route() {
        println!("  http://{addr}/metrics   (Prometheus text; Authorization: Bearer <KEYRATE_METRICS_TOKEN>)");
    } else {
        println!("  /metrics off (set KEYRATE_METRICS_TOKEN to turn it on)");
    }
    if app.admin_routes() {
        println!(
            "  http://{addr}/admin/plans[/{{free,pro}}]  (GET / PUT JSON quotas; X-Admin-Token from the configuration)"
        );
    } else {
        println!("  admin routes off (set KEYRATE_ADMIN_TOKEN to turn them on)");
    }
    println!(
        "  per customer (free plan; pro: 5x bursts, 10x rates, streams and daily characters): \
         {} streams open at once; connections+contexts {} burst, {}/s; \
         synthesis {} chars burst, {} chars/s, {} chars a day; per org {} chars burst, {} chars/s; \
         closed (1008) after {} ignored retry_afters; unknown keys 401, then 429 after {} from one address",
        limits.max_streams,
        limits.connect_burst,
        limits.connect_rate,
        limits.synth_burst,
        limits.synth_rate,
        limits.daily_chars,
        limits.org_synth_burst,
        limits.org_synth_rate,
        limits.max_strikes,
        limits.auth_failure_burst,
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
    /// `--keys FILE`: the key table.
    keys: Option<String>,
    /// `--admin-token TOKEN`.
    admin_token: Option<String>,
    /// `--key-label CUSTOMER_ID`: print its label and exit.
    key_label: Option<String>,
    /// `--demo`: with no key table, use the built-in public demo keys.
    demo: bool,
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
                "--keys" => config.keys = Some(value()?),
                "--admin-token" => config.admin_token = Some(value()?),
                "--key-label" => config.key_label = Some(value()?),
                "--demo" if inline.is_none() => config.demo = true,
                // The name only: a mistyped `--admin-tokn=SECRET` must
                // not print its value.
                _ => return Err(format!("unknown argument {name:?}")),
            }
        }
        Ok(config)
    }
}
