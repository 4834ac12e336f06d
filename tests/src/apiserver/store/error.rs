//! Errors as the API server answers them.

use super::super::validate::Cause;
use super::resource_types::ResourceType;
use serde_json::{json, Value};

/// An error answered as a Kubernetes `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// An error about object `name` of `rt`, with the details the server
    /// gives such errors.
    fn about_object(
        rt: &ResourceType,
        name: &str,
        code: u16,
        reason: &'static str,
        message: String,
    ) -> Self {
        ApiError {
            details: Some(json!({"name": name, "group": rt.group, "kind": rt.plural})),
            ..Self::new(code, reason, message)
        }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", qualified(rt));
        Self::about_object(rt, name, 404, "NotFound", message)
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", qualified(rt));
        Self::about_object(rt, name, 409, "AlreadyExists", message)
    }

    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            qualified(rt)
        );
        Self::about_object(rt, name, 409, "Conflict", message)
    }

    pub fn invalid(rt: &ResourceType, name: &str, causes: &[Cause]) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        ApiError {
            details: Some(json!({
                "name": name, "group": rt.group, "kind": rt.kind,
                "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>(),
            })),
            ..Self::new(
                422,
                "Invalid",
                format!(
                    "{}.{} \"{name}\" is invalid: [{}]",
                    rt.kind,
                    rt.group,
                    summary.join(", ")
                ),
            )
        }
    }

    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        // An error the server has no reason for (StatusReasonUnknown) carries none.
        if self.reason.is_empty() {
            if let Some(m) = status.as_object_mut() {
                m.remove("reason");
            }
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

fn qualified(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        rt.plural.to_string()
    } else {
        format!("{}.{}", rt.plural, rt.group)
    }
}
