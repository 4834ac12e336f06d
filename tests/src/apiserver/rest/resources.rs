//! A resource's collection and its items: list, create, get, replace,
//! patch, apply, delete, and the status subresource.

use super::super::selector::{parse_field_selector, parse_label_selector};
use super::super::store::error::ApiError;
use super::super::store::events::Filter;
use super::super::store::resource_types::Subresource;
use super::super::store::resource_types::{find_type, ResourceType};
use super::watch::watch;
use super::{
    error_response, json_response, lock, result_response, Body, Params, RequestContext, Shared,
};
use http::{Method, Response};
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) async fn resource_route(
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
