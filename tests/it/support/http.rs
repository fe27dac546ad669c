//! `Api`: how every test speaks HTTP to a delayq node, in-process or a process of its
//! own. One request builder (method, path, token, body), and the shapes tests read
//! back: the status with the JSON answer, the raw response, or nothing when the
//! node does not answer at all.

use std::fmt::Display;
use std::time::Duration;

use serde_json::Value;

/// A node's HTTP API: its address, the client, and the token sent by default.
#[derive(Clone, Debug)]
pub struct Api {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
    timeout: Duration,
}

/// Makes ring this test process's TLS provider, as `delayq` does for itself:
/// every HTTP client here needs one.
pub fn tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Api {
    /// The API at `addr` (`host:port`): no token, at most 30 s a request.
    pub fn new(addr: impl Display) -> Api {
        tls_provider();
        Api {
            client: reqwest::Client::new(),
            base: format!("http://{addr}"),
            token: None,
            timeout: Duration::from_secs(30),
        }
    }

    /// Sends `token` with every request that does not name its own.
    pub fn with_token(mut self, token: &str) -> Api {
        self.token = Some(token.to_owned());
        self
    }

    /// Gives every request at most `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Api {
        self.timeout = timeout;
        self
    }

    /// A fresh connection for every request: a server may close one after refusing a
    /// body it did not read, and a pooled reuse of it would fail on the client.
    pub fn unpooled(mut self) -> Api {
        self.client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("an HTTP client");
        self
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request with this API's timeout and token, to add to before sending.
    pub fn request(&self, method: &str, path: &str) -> reqwest::RequestBuilder {
        self.builder(method, path, self.token.as_deref())
    }

    fn builder(&self, method: &str, path: &str, token: Option<&str>) -> reqwest::RequestBuilder {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let req = self
            .client
            .request(method, self.url(path))
            .timeout(self.timeout);
        match token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// Sends one request with exactly `token` (none at all when None) and a raw JSON
    /// body; the response as it came, or the client's error when none came.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&[u8]>,
    ) -> reqwest::Result<reqwest::Response> {
        let mut req = self.builder(method, path, token);
        if let Some(body) = body {
            req = req
                .header("content-type", "application/json")
                .body(body.to_vec());
        }
        req.send().await
    }

    /// One request with exactly `token`; its status and JSON answer (Null when the
    /// answer is not JSON). Panics when the node does not answer.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Value) {
        self.try_call(method, path, token, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e:?}"))
    }

    /// `call`, or the client's error when the node does not answer.
    pub async fn try_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> reqwest::Result<(u16, Value)> {
        let resp = self
            .send(method, path, token, body.map(str::as_bytes))
            .await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// GET with this API's token.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, self.token.as_deref(), None).await
    }

    /// GET with this API's token, or None when the node does not answer.
    pub async fn try_get(&self, path: &str) -> Option<(u16, Value)> {
        self.try_call("GET", path, self.token.as_deref(), None)
            .await
            .ok()
    }

    /// POSTs JSON with this API's token.
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.post_raw(path, &body.to_string()).await
    }

    /// Schedules message `id` (its id as payload) to `stream`, due in `delay_ms`,
    /// with this API's token; panics unless it is scheduled (201).
    pub async fn schedule(&self, id: &str, stream: &str, delay_ms: u64) {
        let body =
            serde_json::json!({ "id": id, "stream": stream, "payload": id, "delay_ms": delay_ms });
        let (status, answer) = self.post("/v1/messages", body).await;
        assert_eq!(status, 201, "push {id}: {answer}");
    }

    /// Pushes `body` (a message to `stream` due now with a ttl of a few ms) so that
    /// it expires for sure: a forward a millisecond after the push would deliver
    /// it. Its stream is paused first, and a probe due 300 ms later shows when the
    /// leader holds the stream (on Redis Cluster a pause takes hold within 250 ms;
    /// a probe that went out before is followed by another, and stays in the
    /// stream). The message waits out its ttl there, the probe held is cancelled and
    /// the stream resumed, so the message is dead-lettered as expired.
    pub async fn push_expiring(&self, stream: &str, body: Value) {
        self.stream_action(stream, "pause").await;
        let held = self.held_probe(stream).await;
        let ttl = body["ttl_ms"].as_u64().expect("a ttl_ms");
        let (status, answer) = self.post("/v1/messages", body).await;
        assert_eq!(status, 201, "{answer}");
        // Its due time is Redis's now at the push; this clock runs with Redis's.
        tokio::time::sleep(Duration::from_millis(ttl + 2)).await;
        let (status, answer) = self.delete(&format!("/v1/messages/{held}")).await;
        assert_eq!(status, 200, "cancel the probe: {answer}");
        self.stream_action(stream, "resume").await;
    }

    /// `POST /v1/streams/{stream}/{action}` (pause, resume), which must succeed.
    async fn stream_action(&self, stream: &str, action: &str) {
        let (status, answer) = self
            .post(
                &format!("/v1/streams/{stream}/{action}"),
                serde_json::json!({}),
            )
            .await;
        assert_eq!(status, 200, "{action} {stream}: {answer}");
    }

    /// Pushes probes to a paused `stream` until one is held (listed as such under
    /// its key); its id.
    async fn held_probe(&self, stream: &str) -> String {
        for n in 0..20 {
            let probe = format!("pause-probe-{n}");
            let (status, answer) = self
                .post(
                    "/v1/messages",
                    serde_json::json!({ "id": probe, "stream": stream, "payload": probe, "delay_ms": 300, "key": probe }),
                )
                .await;
            assert_eq!(status, 201, "push {probe}: {answer}");
            let state = super::eventually(Duration::from_secs(10), "the probe due", || async {
                let (_, answer) = self
                    .get(&format!("/v1/streams/{stream}/keys/{probe}"))
                    .await;
                let state = answer["messages"][0]["state"].as_str().map(str::to_owned);
                state.filter(|s| s != "scheduled")
            })
            .await;
            if state == "held" {
                return probe;
            }
            assert_eq!(state, "delivered", "{probe}");
        }
        panic!("a pause of {stream} never took hold")
    }

    /// POSTs JSON with this API's token, or the client's error when the node does
    /// not answer.
    pub async fn try_post(&self, path: &str, body: &Value) -> reqwest::Result<(u16, Value)> {
        let body = body.to_string();
        self.try_call("POST", path, self.token.as_deref(), Some(&body))
            .await
    }

    /// POSTs JSON text as it is, with this API's token.
    pub async fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        self.call("POST", path, self.token.as_deref(), Some(body))
            .await
    }

    /// DELETE with this API's token.
    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.call("DELETE", path, self.token.as_deref(), None).await
    }

    /// The status of a GET with this API's token; None when the node does not answer.
    pub async fn status(&self, path: &str) -> Option<u16> {
        Some(self.try_get(path).await?.0)
    }

    /// The node's `/metrics` text; None when it does not answer.
    pub async fn metrics(&self) -> Option<String> {
        let resp = self.request("GET", "/metrics").send().await.ok()?;
        resp.text().await.ok()
    }
}

/// The row of `stream` in a `GET /v1/streams` answer.
pub fn stream_row(streams: &Value, stream: &str) -> Option<Value> {
    streams["streams"]
        .as_array()?
        .iter()
        .find(|s| s["stream"] == stream)
        .cloned()
}

/// Asserts that an API answer is the refusal expected: its status, its error code
/// (`"error"`) and a `"detail"` that mentions `detail_part`. `case` names the case
/// in a failure message.
#[track_caller]
pub fn assert_refused(
    (status, answer): (u16, &Value),
    (want_status, code, detail_part): (u16, &str, &str),
    case: &str,
) {
    assert_eq!(status, want_status, "{case}: status; answer {answer}");
    assert_eq!(answer["error"], code, "{case}: error code; answer {answer}");
    let detail = answer["detail"]
        .as_str()
        .unwrap_or_else(|| panic!("{case}: no detail in {answer}"));
    assert!(
        detail.contains(detail_part),
        "{case}: detail {detail:?} should mention {detail_part:?}"
    );
}
