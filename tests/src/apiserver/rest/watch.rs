//! Watches: the initial events, bookmarks, expiry and the live stream.

use super::super::store::error::ApiError;
use super::super::store::events::Filter;
use super::super::store::resource_types::ResourceType;
use super::{error_response, lock, Body, Params, Shared};
use http::{header, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

/// The ERROR event a real server sends inside a watch whose resource
/// version was compacted (`storage.NewTooLargeResourceVersionError`'s
/// sibling: `too old resource version: N (M)`, reason Expired, code 410).
fn expired_line(resource_version: u64, compacted: u64) -> Bytes {
    let status = ApiError::new(
        410,
        "Expired",
        format!("too old resource version: {resource_version} ({compacted})"),
    );
    watch_line("ERROR", &status.to_status())
}

fn expired_watch(resource_version: u64, compacted: u64) -> Response<Body> {
    let mut response = Response::new(Full::new(expired_line(resource_version, compacted)).boxed());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn watch_line(event_type: &str, object: &Value) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn bookmark(rt: &ResourceType, resource_version: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": resource_version.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    watch_line(
        "BOOKMARK",
        &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata}),
    )
}

/// Default watch length when the client sets no timeoutSeconds (the real
/// server picks 30-60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

pub(super) fn watch(
    shared: &Arc<Shared>,
    rt: &'static ResourceType,
    filter: Filter,
    params: &Params,
) -> Response<Body> {
    if params.send_initial_events && !params.allow_watch_bookmarks {
        return error_response(&ApiError::invalid(
            rt,
            "",
            &[super::super::validate::Cause {
                reason: "FieldValueForbidden",
                field: "allowWatchBookmarks".to_string(),
                message: "sendInitialEvents requires allowWatchBookmarks=true".to_string(),
            }],
        ));
    }
    let compacted = *lock(&shared.compacted);
    let (initial, start_rv, mut live) = {
        let store = lock(&shared.store);
        let live = store.subscribe();
        let current = store.resource_version();
        let from = match params.resource_version.as_deref() {
            None | Some("") | Some("0") => None,
            Some(rv) => match rv.parse::<u64>() {
                Ok(v) => Some(v),
                Err(_) => {
                    return error_response(&ApiError::bad_request(format!(
                        "invalid resource version {rv:?}"
                    )))
                }
            },
        };
        if let Some(rv) = from.filter(|rv| *rv < compacted) {
            return expired_watch(rv, compacted);
        }
        let initial: Vec<Bytes> = match (params.send_initial_events, from) {
            (true, _) | (false, None) => store
                .list(rt, &filter)
                .iter()
                .map(|o| watch_line("ADDED", o))
                .collect(),
            (false, Some(rv)) => store
                .events_since(rt, rv)
                .iter()
                .filter_map(|e| filter.view(e))
                .map(|(t, o)| watch_line(t.as_str(), &o))
                .collect(),
        };
        (initial, current.max(from.unwrap_or(0)), live)
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let allow_bookmarks = params.allow_watch_bookmarks;
    let send_initial_end = params.send_initial_events;
    let bookmark_interval = shared.bookmark_interval;
    let timeout = params
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let mut expiry = shared.expiry.subscribe();
    let compacted_now = shared.clone();
    tokio::spawn(async move {
        let mut last_rv = start_rv;
        for line in initial {
            if tx.send(line).await.is_err() {
                return;
            }
        }
        if send_initial_end && tx.send(bookmark(rt, last_rv, true)).await.is_err() {
            return;
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(bookmark_interval);
        ticker.tick().await;
        loop {
            let line = tokio::select! {
                _ = &mut deadline => break,
                _ = tx.closed() => break,
                changed = expiry.changed() => {
                    if changed.is_ok() {
                        let compacted = *lock(&compacted_now.compacted);
                        let _ = tx.send(expired_line(last_rv, compacted)).await;
                    }
                    break;
                }
                _ = ticker.tick(), if allow_bookmarks => bookmark(rt, last_rv, false),
                received = live.recv() => match received {
                    Ok(event) => {
                        if event.resource_version <= last_rv {
                            continue;
                        }
                        last_rv = event.resource_version;
                        if event.plural != rt.plural || event.group != rt.group {
                            continue;
                        }
                        match filter.view(&event) {
                            Some((t, o)) => watch_line(t.as_str(), &o),
                            None => continue,
                        }
                    }
                    // Fallen too far behind or the store is gone: end the
                    // watch; the client lists again.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => break,
                },
            };
            if tx.send(line).await.is_err() {
                break;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|line| (Ok::<_, Infallible>(Frame::data(line)), rx))
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}
