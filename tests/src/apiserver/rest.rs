//! The REST surface: discovery, CRUD, patch, status and watch on the real
//! Kubernetes paths, answered in the API server's JSON.

use super::selector::{parse_field_selector, parse_label_selector, parse_query};
use super::store::{find_type, ApiError, Filter, ResourceType, Store, Subresource, RESOURCE_TYPES};
use super::{Received, RequestLine};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

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

async fn resource_route(
    shared: &Arc<Shared>,
    group: &str,
    version: &str,
    rest: &[&str],
    ctx: RequestContext,
    path: &str,
) -> Response<Body> {
    let not_found = || {
        error_response(&ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        ))
    };
    let (namespace, plural, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if find_type(group, version, plural).is_some_and(|t| t.namespaced) =>
        {
            (Some(*ns), *plural, tail)
        }
        [plural, tail @ ..] => (None, *plural, tail),
        [] => return not_found(),
    };
    let Some(rt) = find_type(group, version, plural) else {
        return not_found();
    };
    if namespace.is_some() != rt.namespaced
        && !(rt.namespaced && tail.is_empty() && namespace.is_none())
    {
        return not_found();
    }
    let ns = namespace.unwrap_or("");
    match tail {
        [] => collection(shared, rt, namespace, ctx).await,
        [name] => item(
            shared,
            rt,
            ns,
            name,
            Subresource::Main,
            ctx,
            namespace.is_some() || !rt.namespaced,
        ),
        [name, "status"] if rt.has_status => item(
            shared,
            rt,
            ns,
            name,
            Subresource::Status,
            ctx,
            namespace.is_some() || !rt.namespaced,
        ),
        _ => not_found(),
    }
}

fn filter_from(
    rt: &ResourceType,
    namespace: Option<&str>,
    params: &Params,
) -> Result<Filter, ApiError> {
    Ok(Filter {
        namespace: namespace.map(str::to_string),
        labels: parse_label_selector(&params.label_selector).map_err(ApiError::bad_request)?,
        fields: parse_field_selector(&params.field_selector, &rt.supported_fields())
            .map_err(ApiError::bad_request)?,
    })
}

fn manager_of(ctx: &RequestContext) -> String {
    ctx.params
        .field_manager
        .clone()
        .or_else(|| ctx.user_agent.clone())
        .unwrap_or_else(|| "unknown".to_string())
}

async fn collection(
    shared: &Arc<Shared>,
    rt: &'static ResourceType,
    namespace: Option<&str>,
    ctx: RequestContext,
) -> Response<Body> {
    let filter = match filter_from(rt, namespace, &ctx.params) {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    match ctx.method {
        Method::GET if ctx.params.watch => watch(shared, rt, filter, &ctx.params),
        Method::GET => {
            let store = lock(&shared.store);
            let items = store.list(rt, &filter);
            json_response(
                200,
                &json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(),
                "metadata": {"resourceVersion": store.resource_version().to_string()}, "items": items}),
            )
        }
        Method::POST => {
            let Some(ns) = namespace.or((!rt.namespaced).then_some("")) else {
                return error_response(&ApiError::bad_request(
                    "a namespaced resource is created in a namespace",
                ));
            };
            let manager = manager_of(&ctx);
            let result = lock(&shared.store).create(
                rt,
                ns,
                ctx.body,
                Some((&manager, "Update")),
                ctx.params.dry_run,
            );
            result_response(201, result)
        }
        Method::DELETE => {
            let mut store = lock(&shared.store);
            let names: Vec<(String, String)> = store
                .list(rt, &filter)
                .iter()
                .map(|o| {
                    let s = |p: &str| {
                        o.pointer(p)
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string()
                    };
                    (s("/metadata/namespace"), s("/metadata/name"))
                })
                .collect();
            let mut deleted = Vec::new();
            for (ns, name) in names {
                match store.delete(rt, &ns, &name, None, None, ctx.params.dry_run) {
                    Ok(o) => deleted.push(o),
                    Err(e) => return error_response(&e),
                }
            }
            json_response(
                200,
                &json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(),
                "metadata": {"resourceVersion": store.resource_version().to_string()}, "items": deleted}),
            )
        }
        _ => method_not_allowed(&ctx.method),
    }
}

fn method_not_allowed(method: &Method) -> Response<Body> {
    error_response(&ApiError::new(
        405,
        "MethodNotAllowed",
        format!("the server does not allow this method on the requested resource ({method})"),
    ))
}

fn item(
    shared: &Arc<Shared>,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    subresource: Subresource,
    ctx: RequestContext,
    addressable: bool,
) -> Response<Body> {
    if !addressable {
        return error_response(&ApiError::new(
            404,
            "NotFound",
            format!("{} must be addressed in a namespace", rt.plural),
        ));
    }
    let manager = manager_of(&ctx);
    let dry_run = ctx.params.dry_run;
    let mut store = lock(&shared.store);
    match ctx.method {
        Method::GET => result_response(200, store.get(rt, ns, name)),
        Method::PUT => result_response(200, store.update(rt, ns, name, ctx.body, subresource, Some((&manager, "Update")), dry_run)),
        Method::PATCH => match ctx.content_type.as_deref() {
            Some("application/merge-patch+json") | Some("application/strategic-merge-patch+json") => {
                result_response(200, store.merge_patch(rt, ns, name, &ctx.body, subresource, Some((&manager, "Update")), dry_run))
            }
            Some("application/apply-patch+yaml") | Some("application/apply-patch+cbor") => {
                let Some(field_manager) = ctx.params.field_manager.as_deref() else {
                    return error_response(&ApiError::bad_request("PATCH, application/apply-patch+yaml requires fieldManager parameter"));
                };
                let existed = store.get(rt, ns, name).is_ok();
                let result = store.apply(rt, ns, name, &ctx.body, subresource, field_manager, ctx.params.force, dry_run);
                result_response(if existed { 200 } else { 201 }, result)
            }
            other => error_response(&ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format ({}); accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml", other.unwrap_or("none")),
            )),
        },
        Method::DELETE if subresource == Subresource::Main => {
            let uid = ctx.body.pointer("/preconditions/uid").and_then(Value::as_str);
            let rv = ctx.body.pointer("/preconditions/resourceVersion").and_then(Value::as_str);
            let body_dry_run = ctx.body.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|v| v == "All"));
            result_response(200, store.delete(rt, ns, name, uid, rv, dry_run || body_dry_run))
        }
        _ => method_not_allowed(&ctx.method),
    }
}

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

fn watch(
    shared: &Arc<Shared>,
    rt: &'static ResourceType,
    filter: Filter,
    params: &Params,
) -> Response<Body> {
    if params.send_initial_events && !params.allow_watch_bookmarks {
        return error_response(&ApiError::invalid(
            rt,
            "",
            &[super::validate::Cause {
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
