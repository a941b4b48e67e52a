//! The HTTP side: accepting connections, dispatching requests to handlers, and tearing
//! everything down on `stop()`.
//!
//! We own the accept loop and every connection task (instead of a framework's `serve`) so that
//! stopping really is what a killed API server looks like to clients: the listener closes
//! (new connections are refused) and every open connection, watches included, is cut.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::controls::{Controls, RecordedRequest};
use crate::discovery::{self, Form};
use crate::error::ApiError;
use crate::http::{Body, Query, error_response, json_response, json_response_as, text_response};
use crate::routes::{Route, route};
use crate::store::{ObjectKey, Store};
use crate::write::{self, Payload};
use crate::{list, watch};

/// Everything the handlers share; survives `stop()`/`restart()`.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Store,
    pub controls: Controls,
    pub bookmark_interval: Duration,
    /// The address clients use (fixed at the first bind, reused by `restart()`).
    pub address: SocketAddr,
}

/// A running accept loop.
#[derive(Debug)]
pub(crate) struct Running {
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub(crate) fn start(listener: TcpListener, shared: Arc<Shared>) -> Self {
        let (shutdown, stop) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, shared, stop));
        Running { shutdown, task }
    }

    /// Closes the listener and cuts every connection; returns once all are gone.
    pub(crate) async fn stop(self) {
        let _ = self.shutdown.send(());
        let _ = self.task.await;
    }

    /// For `Drop`: cuts everything without waiting (aborting the loop drops its connections).
    pub(crate) fn abort(self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, shared.clone()));
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| handle(shared.clone(), request));
    if let Err(error) = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%error, "connection ended with an error");
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let query = Query::parse(request.uri().query());
    shared.controls.record(RecordedRequest {
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
        query: query.pairs().to_vec(),
    });
    shared.controls.wait_while_paused().await;
    let response = match dispatch(shared, request, &query).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    };
    Ok(response)
}

async fn dispatch(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    query: &Query,
) -> Result<Response<Body>, ApiError> {
    let Some(target) = route(request.uri().path()) else {
        return Err(ApiError::NoSuchPath);
    };
    let method = request.method().clone();
    match target {
        Route::Collection { resource, namespace } => {
            let namespace = namespace.as_deref();
            match method {
                Method::GET if query.flag("watch")? => {
                    let body =
                        watch::watch(shared.clone(), resource, namespace.map(str::to_string), query).await?;
                    Ok(watch_response(body))
                }
                Method::GET => Ok(json_response(
                    200,
                    &list::list(&shared.store, resource, namespace, query).await?,
                )),
                Method::POST if namespace.is_some() || !resource.namespaced => {
                    let (content_type, bytes) = read_body(request).await?;
                    let payload = Payload {
                        content_type: content_type.as_deref(),
                        bytes: &bytes,
                    };
                    respond(write::create(&shared.store, resource, namespace, query, &payload))
                }
                Method::DELETE if namespace.is_some() || !resource.namespaced => respond(
                    write::delete_collection(&shared.store, resource, namespace, query),
                ),
                _ => Err(ApiError::MethodNotAllowed),
            }
        }
        Route::Item {
            resource,
            namespace,
            name,
        } => {
            let key = ObjectKey::new(resource, namespace.as_deref().unwrap_or_default(), &name);
            let store = &shared.store;
            if method == Method::GET {
                return respond(write::get(store, &key));
            }
            let (content_type, bytes) = read_body(request).await?;
            let payload = Payload {
                content_type: content_type.as_deref(),
                bytes: &bytes,
            };
            match method {
                Method::PUT => respond(write::replace(store, &key, query, &payload)),
                Method::PATCH => respond(write::patch(store, &key, query, &payload)),
                Method::DELETE => respond(write::delete(store, &key, query, &payload)),
                _ => Err(ApiError::MethodNotAllowed),
            }
        }
        discovery_route => {
            if method != Method::GET {
                return Err(ApiError::MethodNotAllowed);
            }
            let accept = request.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
            Ok(discovery_response(
                &shared,
                discovery_route,
                discovery::negotiate(accept),
            ))
        }
    }
}

fn discovery_response(shared: &Shared, target: Route, form: Form) -> Response<Body> {
    match (target, form) {
        (
            Route::CoreVersions,
            Form::Aggregated {
                content_type,
                api_version,
            },
        ) => json_response_as(200, &discovery::aggregated(true, api_version), content_type),
        (
            Route::Groups,
            Form::Aggregated {
                content_type,
                api_version,
            },
        ) => json_response_as(200, &discovery::aggregated(false, api_version), content_type),
        (Route::CoreVersions, Form::Legacy) => {
            json_response(200, &discovery::core_versions(&shared.address.to_string()))
        }
        (Route::Groups, Form::Legacy) => json_response(200, &discovery::groups()),
        (Route::Group(group), _) => json_response(200, &discovery::group(group)),
        (Route::Resources { group, version }, _) => {
            json_response(200, &discovery::resource_list(group, version))
        }
        (Route::Version, _) => json_response(200, &discovery::version()),
        (Route::Health, _) => text_response(200, "ok"),
        (Route::Root, _) => json_response(200, &discovery::root_paths()),
        (Route::Collection { .. } | Route::Item { .. }, _) => error_response(&ApiError::NoSuchPath),
    }
}

fn respond(result: Result<(u16, serde_json::Value), ApiError>) -> Result<Response<Body>, ApiError> {
    result.map(|(code, value)| json_response(code, &value))
}

fn watch_response(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(crate::http::JSON),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache, private"),
    );
    response
}

async fn read_body(request: Request<Incoming>) -> Result<(Option<String>, Bytes), ApiError> {
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = request
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::BadRequest(format!("reading the request body: {e}")))?
        .to_bytes();
    Ok((content_type, bytes))
}
