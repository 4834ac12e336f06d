//! The store's changes as lists and watches see them.

use super::super::selector::{fields_match, labels_match, FieldRequirement, LabelRequirement};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as the store's event log and live watches see it.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub resource_version: u64,
    pub plural: &'static str,
    pub group: &'static str,
    pub event_type: EventType,
    pub object: Value,
    /// The object before a modification (to tell a watch with a selector
    /// that an object left or entered its view).
    pub previous: Option<Value>,
}

/// What a list or watch filters on.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub labels: Vec<LabelRequirement>,
    pub fields: Vec<FieldRequirement>,
}

impl Filter {
    pub fn matches(&self, object: &Value) -> bool {
        let ns_ok = self.namespace.as_deref().is_none_or(|ns| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        });
        ns_ok && labels_match(&self.labels, object) && fields_match(&self.fields, object)
    }

    /// The event a watch with this filter sees for a stored event, if any:
    /// an object that stops matching is reported DELETED, one that starts
    /// matching ADDED.
    pub fn view(&self, event: &StoredEvent) -> Option<(EventType, Value)> {
        let now = self.matches(&event.object);
        let before = event.previous.as_ref().is_some_and(|p| self.matches(p));
        match (event.event_type, before, now) {
            (EventType::Modified, true, false) => Some((EventType::Deleted, event.object.clone())),
            (EventType::Modified, false, true) => Some((EventType::Added, event.object.clone())),
            (EventType::Modified, false, false) => None,
            (t, _, true) => Some((t, event.object.clone())),
            (_, _, false) => None,
        }
    }
}
