//! The REST surface: discovery, CRUD, patch, status and watch on the real
//! Kubernetes paths, answered in the API server's JSON.

mod resources;
mod watch;

use super::selector::parse_query;
use super::store::error::ApiError;
use super::store::resource_types::RESOURCE_TYPES;
use super::store::Store;
use super::{Received, RequestLine};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use resources::resource_route;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub type Body = BoxBody<Bytes, Infallible>;

/// State shared by the server's connections and the test-side handle.
pub struct Shared {
    pub store: Mutex<Store>,
    pub received: Mutex<Vec<Received>>,
    pub requests: Mutex<Vec<RequestLine>>,
    pub faults: Mutex<Vec<Fault>>,
    pub bookmark_interval: Duration,
    pub server_address: String,
    /// What `/version` answers instead of the release played, if set.
    pub version_answer: Mutex<Option<Value>>,
    /// Bumped to expire every open watch.
    pub expiry: tokio::sync::watch::Sender<u64>,
    /// Watches from a resource version below this have expired.
    pub compacted: Mutex<u64>,
}

/// A failure the test asked for: the next `remaining` requests whose
/// method and path match are answered with `code` instead of being served.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: String,
    pub path_contains: String,
    pub code: u16,
    pub remaining: usize,
}

fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// Takes one matching injected fault, if any.
fn injected_fault(shared: &Shared, method: &Method, path_and_query: &str) -> Option<ApiError> {
    let mut faults = lock(&shared.faults);
    let fault = faults.iter_mut().find(|f| {
        f.remaining > 0
            && f.method.eq_ignore_ascii_case(method.as_str())
            && path_and_query.contains(&f.path_contains)
    })?;
    fault.remaining -= 1;
    Some(ApiError::new(
        fault.code,
        reason_for(fault.code),
        format!("injected failure for {method} {path_and_query}"),
    ))
}

/// A poisoned lock only means a handler panicked; the data is still usable
/// for a test double, and refusing it would hide the first failure.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    shared_state::sync::lock(m)
}

fn json_response(code: u16, value: &Value) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.code, &error.to_status())
}

fn result_response(code: u16, result: Result<Value, ApiError>) -> Response<Body> {
    match result {
        Ok(v) => json_response(code, &v),
        Err(e) => error_response(&e),
    }
}

/// Parsed query parameters the server understands; others are ignored.
#[derive(Default, Debug)]
struct Params {
    watch: bool,
    label_selector: String,
    field_selector: String,
    resource_version: Option<String>,
    allow_watch_bookmarks: bool,
    send_initial_events: bool,
    timeout_seconds: Option<u64>,
    field_manager: Option<String>,
    force: bool,
    dry_run: bool,
}

fn truthy(v: &str) -> bool {
    matches!(v, "true" | "1" | "True")
}

fn parse_params(query: &str) -> Params {
    let mut p = Params::default();
    for (k, v) in parse_query(query) {
        match k.as_str() {
            "watch" => p.watch = truthy(&v),
            "labelSelector" => p.label_selector = v,
            "fieldSelector" => p.field_selector = v,
            "resourceVersion" => p.resource_version = Some(v),
            "allowWatchBookmarks" => p.allow_watch_bookmarks = truthy(&v),
            "sendInitialEvents" => p.send_initial_events = truthy(&v),
            "timeoutSeconds" => p.timeout_seconds = v.parse().ok(),
            "fieldManager" => p.field_manager = Some(v).filter(|m| !m.is_empty()),
            "force" => p.force = truthy(&v),
            "dryRun" => p.dry_run = v == "All",
            _ => {}
        }
    }
    p
}

fn parse_body(content_type: Option<&str>, raw: &[u8]) -> Result<Value, ApiError> {
    if raw.is_empty() {
        return Ok(Value::Null);
    }
    match serde_json::from_slice(raw) {
        Ok(v) => Ok(v),
        Err(json_error) => {
            if content_type.is_some_and(|c| c.contains("yaml")) {
                serde_saphyr::from_slice::<Value>(raw).map_err(|e| {
                    ApiError::bad_request(format!("the body is neither JSON nor YAML: {e}"))
                })
            } else {
                Err(ApiError::bad_request(format!(
                    "the body is not valid JSON: {json_error}"
                )))
            }
        }
    }
}

pub async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or("").to_string();
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.split(';').next().unwrap_or(s).trim().to_string());
    let user_agent = request
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.split('/').next().unwrap_or(s).to_string());
    let path_and_query = if query.is_empty() {
        path.clone()
    } else {
        format!("{path}?{query}")
    };
    lock(&shared.requests).push(RequestLine {
        method: method.to_string(),
        path: path_and_query.clone(),
    });
    let raw = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return Ok(error_response(&ApiError::bad_request(format!(
                "reading the body: {e}"
            ))))
        }
    };
    let body = match parse_body(content_type.as_deref(), &raw) {
        Ok(b) => b,
        Err(e) => {
            record(
                &shared,
                &method,
                &path_and_query,
                content_type.clone(),
                Value::String(String::from_utf8_lossy(&raw).into_owned()),
            );
            return Ok(error_response(&e));
        }
    };
    if !body.is_null() {
        record(
            &shared,
            &method,
            &path_and_query,
            content_type.clone(),
            body.clone(),
        );
    }
    if let Some(fault) = injected_fault(&shared, &method, &path_and_query) {
        return Ok(error_response(&fault));
    }
    let params = parse_params(&query);
    let ctx = RequestContext {
        method,
        content_type,
        user_agent,
        params,
        body,
    };
    Ok(route(&shared, &path, ctx).await)
}

fn record(
    shared: &Shared,
    method: &Method,
    path_and_query: &str,
    content_type: Option<String>,
    body: Value,
) {
    lock(&shared.received).push(Received {
        method: method.to_string(),
        path: path_and_query.to_string(),
        content_type,
        body,
    });
}

struct RequestContext {
    method: Method,
    content_type: Option<String>,
    user_agent: Option<String>,
    params: Params,
    body: Value,
}

async fn route(shared: &Arc<Shared>, path: &str, ctx: RequestContext) -> Response<Body> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let not_found = || {
        error_response(&ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        ))
    };
    match segments.as_slice() {
        ["version"] => {
            if let Some(answer) = lock(&shared.version_answer).clone() {
                return json_response(200, &answer);
            }
            let version = lock(&shared.store).version();
            json_response(
                200,
                &json!({"major": "1", "minor": version.minor().to_string(),
                    "gitVersion": version.git_version(), "platform": "linux/amd64"}),
            )
        }
        ["openapi", "v3"] => json_response(
            200,
            &json!({"paths": {"apis/resource.k8s.io/v1": {
                "serverRelativeURL": "/openapi/v3/apis/resource.k8s.io/v1"}}}),
        ),
        ["openapi", "v3", "apis", "resource.k8s.io", "v1"] => {
            let version = lock(&shared.store).version();
            json_response(200, &super::version::openapi_v3_resource_v1(version))
        }
        ["api"] => json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.server_address}]}),
        ),
        ["api", "v1"] => json_response(200, &resource_list("", "v1")),
        ["apis"] => json_response(
            200,
            &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group("resource.k8s.io")]}),
        ),
        ["apis", "resource.k8s.io"] => json_response(200, &api_group("resource.k8s.io")),
        ["apis", "resource.k8s.io", "v1"] => {
            json_response(200, &resource_list("resource.k8s.io", "v1"))
        }
        ["api", "v1", rest @ ..] => resource_route(shared, "", "v1", rest, ctx, path).await,
        ["apis", group, version, rest @ ..] if !rest.is_empty() => {
            resource_route(shared, group, version, rest, ctx, path).await
        }
        _ => not_found(),
    }
}

fn api_group(group: &str) -> Value {
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group,
           "versions": [{"groupVersion": format!("{group}/v1"), "version": "v1"}],
           "preferredVersion": {"groupVersion": format!("{group}/v1"), "version": "v1"}})
}

fn resource_list(group: &str, version: &str) -> Value {
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = Vec::new();
    for rt in RESOURCE_TYPES
        .iter()
        .filter(|t| t.group == group && t.version == version)
    {
        resources.push(json!({"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced, "kind": rt.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}));
        if rt.has_status {
            resources.push(json!({"name": format!("{}/status", rt.plural), "singularName": "", "namespaced": rt.namespaced,
                "kind": rt.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}
