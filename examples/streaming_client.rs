//! Drives `streaming_server` like its customers do, and prints what happened.
//!
//! ```text
//! cargo run --release --example streaming_server --all-features -- --port 0 --demo
//! cargo run --release --example streaming_client --all-features -- --addr 127.0.0.1:PORT
//! ```
//!
//! 1. A voice agent's call start: one connection and four contexts opened
//!    back-to-back, then a sentence spoken in each. All admitted.
//! 2. The same agent opening one context too many: denied with a
//!    retry-after; it waits that long and is admitted.
//! 3. A misbehaving key that sends long texts in a loop, ignoring every
//!    retry-after: admitted until its burst is spent, then denied, then
//!    disconnected with close code 1008.
//! 4. Connections without a key, and a key opening connections in a loop:
//!    refused with 401, then 429 with `Retry-After` and `RateLimit` headers.

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{connect_async, MaybeTlsStream, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What the server answered to one request frame.
enum Reply {
    Frame(Value),
    Closed(u16, String),
}

#[tokio::main]
async fn main() {
    let addr = match parse_addr(std::env::args().skip(1)) {
        Ok(addr) => addr,
        Err(message) => {
            eprintln!("{message}\nusage: streaming_client --addr 127.0.0.1:PORT");
            std::process::exit(2);
        }
    };
    if let Err(err) = run(&addr).await {
        eprintln!("error: {err}");
        std::process::exit(1);
    }
}

async fn run(addr: &str) -> Result<(), WsError> {
    let url = format!("ws://{addr}/v1/stream");

    println!("== 1. voice agent sk_agent_demo: call start");
    let mut agent = connect(&url, Some("sk_agent_demo")).await?;
    for n in 1..=4 {
        let reply = send(
            &mut agent,
            json!({"type": "open", "context_id": format!("ctx-{n}")}),
        )
        .await?;
        print_reply(&format!("open ctx-{n}"), &reply);
    }
    let sentence = "Thanks for calling. How can I help you today?";
    for n in 1..=4 {
        let speak = json!({"type": "speak", "context_id": format!("ctx-{n}"), "text": sentence});
        let reply = send(&mut agent, speak).await?;
        print_reply(&format!("speak ctx-{n} ({} chars)", sentence.len()), &reply);
    }

    println!("== 2. the agent opens one context too many, then honours retry_after");
    let open5 = json!({"type": "open", "context_id": "ctx-5"});
    let reply = send(&mut agent, open5.clone()).await?;
    print_reply("open ctx-5", &reply);
    if let Reply::Frame(frame) = &reply {
        if let Some(ms) = frame["retry_after_ms"].as_u64() {
            println!("   waiting {ms} ms as told");
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let reply = send(&mut agent, open5).await?;
            print_reply("open ctx-5 again", &reply);
        }
    }
    agent.close(None).await?;

    println!("== 3. misbehaving key sk_abuser_demo: 400-char texts in a loop, never waiting");
    let mut abuser = connect(&url, Some("sk_abuser_demo")).await?;
    let reply = send(&mut abuser, json!({"type": "open", "context_id": "spam"})).await?;
    print_reply("open spam", &reply);
    let text = "la ".repeat(133) + "!";
    for n in 1..=1000 {
        let speak = json!({"type": "speak", "context_id": "spam", "text": text});
        let mut reply = send(&mut abuser, speak).await?;
        print_reply(&format!("speak #{n} ({} chars)", text.len()), &reply);
        if let Reply::Frame(frame) = &reply {
            let strikes = (frame["strikes"].as_u64(), frame["max_strikes"].as_u64());
            if matches!(strikes, (Some(strikes), Some(max)) if strikes >= max) {
                // The last strike: the server closes right after this frame.
                reply = receive(&mut abuser, Ok(())).await?;
                print_reply("then", &reply);
            }
        }
        if let Reply::Closed(..) = reply {
            break;
        }
    }

    println!("== 4. connections without a key, and a key opening connections in a loop");
    match connect(&url, None).await {
        Ok(_) => println!("   no key: connected (unexpected)"),
        Err(err) => print_refusal("no key", &err),
    }
    let mut held = Vec::new();
    for n in 1..=10 {
        match connect(&url, Some("sk_flood_demo")).await {
            Ok(socket) => held.push(socket),
            Err(err) => {
                println!("   connection #{n} refused:");
                print_refusal("sk_flood_demo", &err);
                break;
            }
        }
    }
    println!(
        "   sk_flood_demo held {} connections before the refusal",
        held.len()
    );
    for mut socket in held {
        socket.close(None).await?;
    }
    Ok(())
}

/// Opens a WebSocket, with `Authorization: Bearer <key>` if given, and
/// prints the upgrade response's rate-limit header.
async fn connect(url: &str, key: Option<&str>) -> Result<Socket, WsError> {
    let mut request = url.into_client_request()?;
    if let Some(key) = key {
        let value = format!("Bearer {key}")
            .parse()
            .expect("a visible-ASCII key");
        request.headers_mut().insert("authorization", value);
    }
    let (socket, response) = connect_async(request).await?;
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    println!(
        "   connected: HTTP {}, RateLimit: {}",
        response.status().as_u16(),
        header("ratelimit")
    );
    Ok(socket)
}

/// Sends one request frame and reads the server's answer.
async fn send(socket: &mut Socket, request: Value) -> Result<Reply, WsError> {
    // A send can fail once the server has started closing; the close frame
    // it sent is still there to read.
    let sent = socket.send(Message::text(request.to_string())).await;
    receive(socket, sent).await
}

/// Reads the server's next frame; `sent` is the outcome of the send before.
async fn receive(socket: &mut Socket, sent: Result<(), WsError>) -> Result<Reply, WsError> {
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), socket.next()).await;
        let Ok(next) = next else {
            eprintln!("error: no answer from the server within 10 s");
            std::process::exit(1);
        };
        match next {
            Some(Ok(Message::Text(text))) => {
                let frame = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
                return Ok(Reply::Frame(frame));
            }
            Some(Ok(Message::Close(frame))) => {
                let (code, reason) = frame.map_or((1005, String::new()), |f| {
                    (u16::from(f.code), f.reason.as_str().to_owned())
                });
                return Ok(Reply::Closed(code, reason));
            }
            Some(Ok(_)) => continue,
            Some(Err(err)) => return Err(err),
            None => return sent.map(|()| Reply::Closed(1006, "no close frame".into())),
        }
    }
}

fn print_reply(what: &str, reply: &Reply) {
    match reply {
        Reply::Closed(code, reason) => {
            println!("   {what} -> server closed the connection: code {code} \"{reason}\"");
        }
        Reply::Frame(frame) if frame["type"] == "error" && frame["code"] == "rate_limited" => {
            println!(
                "   {what} -> DENIED ({} budget): retry_after {} ms, strikes {}/{}",
                frame["budget"].as_str().unwrap_or("?"),
                frame["retry_after_ms"],
                frame["strikes"],
                frame["max_strikes"]
            );
        }
        Reply::Frame(frame) if frame["type"] == "error" => println!("   {what} -> error {frame}"),
        Reply::Frame(frame) => println!(
            "   {what} -> {}, remaining {}",
            frame["type"].as_str().unwrap_or("?"),
            frame["remaining"]
        ),
    }
}

/// Prints a refused upgrade's status and rate-limit headers.
fn print_refusal(who: &str, err: &WsError) {
    let WsError::Http(response) = err else {
        println!("   {who}: {err}");
        return;
    };
    let mut line = format!("   {who}: HTTP {}", response.status());
    for name in [
        "retry-after",
        "ratelimit",
        "ratelimit-policy",
        "www-authenticate",
    ] {
        if let Some(value) = response.headers().get(name).and_then(|v| v.to_str().ok()) {
            line += &format!(", {name}: {value}");
        }
    }
    println!("{line}");
}

/// Reads `--addr HOST:PORT` (or `--addr=HOST:PORT`).
fn parse_addr(mut args: impl Iterator<Item = String>) -> Result<String, String> {
    let mut addr = None;
    while let Some(arg) = args.next() {
        match arg.strip_prefix("--addr") {
            Some("") => addr = Some(args.next().ok_or("--addr needs a value")?),
            Some(rest) if rest.starts_with('=') => addr = Some(rest[1..].to_owned()),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    addr.ok_or_else(|| "missing --addr (the address streaming_server printed)".to_owned())
}
