//! Shared helpers: a kube client built from the server's kubeconfig (the path kube-proxy-rs
//! takes), object builders, a watcher running in the background, and a raw HTTP/1.1 client for
//! checking exact wire shapes.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kpr_apiserver::{Options, TestApiServer};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Upstream kube-proxy's selector for the Services and EndpointSlices it handles.
pub const PROXIED: &str = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// How long any single expected thing may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub async fn server() -> TestApiServer {
    TestApiServer::start().await.expect("start the test API server")
}

pub async fn server_with(options: Options) -> TestApiServer {
    TestApiServer::start_with(options)
        .await
        .expect("start the test API server")
}

/// A client configured exactly as from `--kubeconfig`.
pub async fn client(server: &TestApiServer) -> Client {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).expect("write kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("read kubeconfig");
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kubeconfig to config");
    Client::try_from(config).expect("client")
}

pub fn service(namespace: &str, name: &str, labels: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
            .filter(|l| !l.is_empty()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.96.0.10".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

pub fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// `namespace/name`, or `name` for cluster-scoped objects.
pub fn id<K: Resource>(object: &K) -> String {
    match object.namespace() {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    }
}

/// A watcher event as a short string, so tests compare sequences.
pub fn describe<K: Resource>(item: Result<watcher::Event<K>, watcher::Error>) -> String {
    match item {
        Ok(watcher::Event::Init) => "Init".into(),
        Ok(watcher::Event::InitApply(object)) => format!("InitApply({})", id(&object)),
        Ok(watcher::Event::InitDone) => "InitDone".into(),
        Ok(watcher::Event::Apply(object)) => format!("Apply({})", id(&object)),
        Ok(watcher::Event::Delete(object)) => format!("Delete({})", id(&object)),
        Err(watcher::Error::WatchError(status)) => format!("Error({} {})", status.code, status.reason),
        Err(other) => format!("Error({other})"),
    }
}

/// A kube-runtime watcher polled in the background; its events arrive described.
pub struct Watching {
    events: mpsc::UnboundedReceiver<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Watching {
    pub fn start<K>(api: Api<K>, config: watcher::Config) -> Self
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static,
    {
        Self::from_stream(watcher(api, config))
    }

    /// With kube-runtime's default backoff between failed attempts (what kube-proxy-rs uses).
    pub fn start_with_backoff<K>(api: Api<K>, config: watcher::Config) -> Self
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static,
    {
        use kube::runtime::WatchStreamExt;
        Self::from_stream(watcher(api, config).default_backoff())
    }

    fn from_stream<K: Resource>(
        stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    ) -> Self {
        let (sender, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                if sender.send(describe(item)).is_err() {
                    return;
                }
            }
        });
        Watching { events, task }
    }

    pub async fn next(&mut self) -> String {
        tokio::time::timeout(PATIENCE, self.events.recv())
            .await
            .expect("a watcher event in time")
            .expect("the watcher is running")
    }

    /// The next `count` events.
    pub async fn take(&mut self, count: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..count {
            out.push(self.next().await);
        }
        out
    }

    /// Events up to and including the first one equal to `wanted`.
    pub async fn until(&mut self, wanted: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let event = self.next().await;
            seen.push(event.clone());
            if event == wanted {
                return seen;
            }
        }
    }

    /// True when no event arrives within `quiet`.
    pub async fn is_quiet_for(&mut self, quiet: Duration) -> Result<(), String> {
        match tokio::time::timeout(quiet, self.events.recv()).await {
            Err(_) => Ok(()),
            Ok(event) => Err(format!("unexpected event {event:?}")),
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn wait_for_watches(server: &TestApiServer, count: usize) {
    tokio::time::timeout(PATIENCE, server.wait_for_open_watches(count))
        .await
        .expect("watches open in time");
}

/// A raw HTTP/1.1 exchange (one request per connection), kept byte for byte.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body exactly as sent (still chunk-framed when chunked).
    pub raw_body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn is_chunked(&self) -> bool {
        self.header("transfer-encoding") == Some("chunked")
    }

    /// The body with chunk framing removed; panics on malformed framing or a missing final chunk.
    pub fn body(&self) -> Vec<u8> {
        if !self.is_chunked() {
            return self.raw_body.clone();
        }
        let mut body = Vec::new();
        let mut rest = &self.raw_body[..];
        loop {
            let line_end = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("chunk size line");
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).expect("hex"), 16)
                .expect("chunk size");
            rest = &rest[line_end + 2..];
            if size == 0 {
                assert!(rest.starts_with(b"\r\n"), "final chunk ends the body cleanly");
                return body;
            }
            body.extend_from_slice(&rest[..size]);
            assert_eq!(&rest[size..size + 2], b"\r\n", "chunk data ends with CRLF");
            rest = &rest[size + 2..];
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body()).expect("a JSON body")
    }

    /// The body as newline-delimited JSON values (watch events).
    pub fn lines(&self) -> Vec<serde_json::Value> {
        let body = self.body();
        assert!(
            body.is_empty() || body.ends_with(b"\n"),
            "every event ends with a newline"
        );
        body.split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_slice(line).expect("one JSON event per line"))
            .collect()
    }
}

pub async fn raw(
    server: &TestApiServer,
    method: &str,
    target: &str,
    body: Option<(&str, &str)>,
) -> RawResponse {
    let mut stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    let mut request = format!(
        "{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        server.addr()
    );
    if let Some((content_type, text)) = body {
        request.push_str(&format!(
            "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
            text.len()
        ));
    }
    request.push_str("\r\n");
    if let Some((_, text)) = body {
        request.push_str(text);
    }
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut bytes = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut bytes))
        .await
        .expect("response in time")
        .expect("read");
    let head_end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = std::str::from_utf8(&bytes[..head_end]).expect("ASCII headers");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    RawResponse {
        status,
        headers,
        raw_body: bytes[head_end + 4..].to_vec(),
    }
}

/// Waits until the server has received a request `matching` accepts; returns it.
pub async fn wait_for_request(
    server: &TestApiServer,
    matching: impl Fn(&kpr_apiserver::RecordedRequest) -> bool,
) -> kpr_apiserver::RecordedRequest {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = server.requests().into_iter().find(|r| matching(r)) {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no matching request in time: {:?}",
            server.requests()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
