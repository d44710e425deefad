//! `readme.rs`: the `serve` example and the fault section's `curl` examples beside it.

use super::*;

/// An HTTP/1.1 exchange as curl makes it; (status, body).
pub fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\
         Connection: close\r\n"
    );
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or(""));
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = vec![];
    s.read_to_end(&mut raw).unwrap();
    let raw = text(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    } else {
        body.to_owned()
    };
    (status, body)
}

/// Runs a `curl` example line against `addr` (its `HOST:PORT`); checks the `# → RESULT` it
/// promises, if any.
pub fn run_curl(line: &str, addr: &str) {
    let words = shell_words(line);
    assert_eq!(words[0], "curl", "{line}");
    let mut method = None;
    let mut url = None;
    let mut body = None;
    let mut i = 1;
    while i < words.len() {
        let w = &words[i];
        if let Some(m) = w.strip_prefix("-X") {
            method = Some(m.to_owned());
        } else if w == "-d" {
            body = Some(words[i + 1].clone());
            i += 1;
        } else if w.starts_with("http://") {
            url = Some(w.clone());
        } else {
            panic!("curl option {w} not understood: {line}");
        }
        i += 1;
    }
    let url = url.expect("a URL");
    let path = url
        .strip_prefix("http://HOST:PORT")
        .unwrap_or_else(|| panic!("URL not http://HOST:PORT/...: {line}"));
    let method = method.unwrap_or_else(|| if body.is_some() { "POST" } else { "GET" }.into());
    let (status, got) = http(addr, &method, path, body.as_deref());
    assert_eq!(status, 200, "{line}: {got}");
    if let Some((_, promised)) = line.split_once("# →") {
        let want: serde_json::Value = serde_json::from_str(promised.trim()).expect("JSON");
        let got: serde_json::Value = serde_json::from_str(&got).expect("JSON answer");
        assert_eq!(got, want, "{line}");
    }
}

/// `kvroute-sim serve`: the one line `listening on 127.0.0.1:PORT`; the fault flags it is given
/// at work; the `curl` examples beside it; SIGTERM stops it cleanly.
pub fn check_serve(args: &[String], block: &[String]) {
    let mut child: Child = bin()
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kvroute-sim serve");
    let addr = super::support::listening_addr(&mut child);

    // The start-up fault spec: `--fault-after N` requests pass, then `--fault-status`; with
    // `--fault-health` /health fails too once they have passed.
    let status: u16 = arg(args, "--fault-status").map_or(500, |s| s.parse().unwrap());
    let after: u64 = arg(args, "--fault-after").map_or(0, |s| s.parse().unwrap());
    let health = args.iter().any(|a| a == "--fault-health");
    for _ in 0..after {
        assert_eq!(http(&addr, "GET", "/v1/models", None).0, 200);
    }
    if args.iter().any(|a| a.starts_with("--fault-")) {
        let (got, body) = http(&addr, "GET", "/v1/models", None);
        assert_eq!(got, status, "{body}");
        let (got, _) = http(&addr, "GET", "/health", None);
        assert_eq!(got, if health { status } else { 200 });
    }

    let curls: Vec<&String> = block
        .iter()
        .filter(|l| l.trim_start().starts_with("curl "))
        .collect();
    for c in &curls {
        run_curl(c.trim(), &addr);
    }
    if !curls.is_empty() {
        // The examples end by clearing the spec: the replica is healthy again.
        assert_eq!(http(&addr, "GET", "/fault", None), (200, "{}".to_owned()));
        assert_eq!(http(&addr, "GET", "/health", None).0, 200);
    }

    super::support::stop(child);
}
