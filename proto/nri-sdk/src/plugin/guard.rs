//! The handler guard: a deadline inside the runtime's request timeout, and a
//! panic turned into an error reply.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use super::PluginError;

/// Why a guarded handler did not produce a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerFailure {
    #[error(transparent)]
    Plugin(PluginError),
    #[error("handler did not answer within {0:?}")]
    Timeout(Duration),
    #[error("handler panicked: {0}")]
    Panicked(String),
}

impl HandlerFailure {
    /// The ttrpc status the runtime receives.
    pub fn into_ttrpc(self, method: &str) -> ttrpc::Error {
        let (code, message) = match &self {
            HandlerFailure::Plugin(PluginError::NotImplemented) => (
                ttrpc::Code::UNIMPLEMENTED,
                format!("{method} is not implemented by this plugin"),
            ),
            HandlerFailure::Plugin(PluginError::Failed(text)) => {
                (ttrpc::Code::UNKNOWN, text.clone())
            }
            HandlerFailure::Timeout(_) => {
                (ttrpc::Code::DEADLINE_EXCEEDED, format!("{method}: {self}"))
            }
            HandlerFailure::Panicked(_) => (ttrpc::Code::INTERNAL, format!("{method}: {self}")),
        };
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
    }
}

/// The deadline for one handler: the configured one, shortened to three
/// quarters of the runtime's own request timeout when the runtime announced
/// a tighter one, so the reply still arrives before the runtime gives up.
pub fn effective_handler_timeout(
    configured: Duration,
    runtime_request_timeout: Option<Duration>,
) -> Duration {
    match runtime_request_timeout {
        Some(runtime) if !runtime.is_zero() => configured.min(runtime * 3 / 4),
        _ => configured,
    }
}

/// Runs `handler` with a deadline, turning a panic into a failure.
pub async fn guard<T, F>(
    method: &'static str,
    timeout: Duration,
    handler: F,
) -> Result<T, HandlerFailure>
where
    F: Future<Output = Result<T, PluginError>> + Send,
{
    let guarded = AssertUnwindSafe(handler).catch_unwind();
    match tokio::time::timeout(timeout, guarded).await {
        Err(_) => Err(HandlerFailure::Timeout(timeout)),
        Ok(Err(panic)) => {
            let text = panic_text(panic.as_ref());
            tracing::error!(method, panic = %text, "NRI handler panicked");
            Err(HandlerFailure::Panicked(text))
        }
        Ok(Ok(result)) => result.map_err(HandlerFailure::Plugin),
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_timeout_stays_inside_the_runtime_timeout() {
        let ms = Duration::from_millis;
        let cases = [
            (ms(1500), None, ms(1500)),
            (ms(1500), Some(Duration::ZERO), ms(1500)),
            (ms(1500), Some(ms(2000)), ms(1500)),
            (ms(1500), Some(ms(1000)), ms(750)),
            (ms(1500), Some(ms(30_000)), ms(1500)),
        ];
        for (configured, runtime, want) in cases {
            assert_eq!(
                effective_handler_timeout(configured, runtime),
                want,
                "{configured:?} {runtime:?}"
            );
        }
    }

    #[tokio::test]
    async fn guard_turns_panic_into_failure() {
        let result: Result<(), _> = guard("Test", Duration::from_secs(5), async {
            if std::hint::black_box(true) {
                panic!("boom in handler");
            }
            Ok(())
        })
        .await;
        assert_eq!(
            result,
            Err(HandlerFailure::Panicked("boom in handler".into()))
        );
    }

    #[tokio::test]
    async fn guard_enforces_the_deadline() {
        let result: Result<(), _> = guard(
            "Test",
            Duration::from_millis(20),
            futures::future::pending(),
        )
        .await;
        assert_eq!(
            result,
            Err(HandlerFailure::Timeout(Duration::from_millis(20)))
        );
    }

    #[test]
    fn failures_map_to_ttrpc_codes() {
        let code = |f: HandlerFailure| match f.into_ttrpc("CreateContainer") {
            ttrpc::Error::RpcStatus(s) => (s.code(), s.message().to_string()),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(
            code(HandlerFailure::Plugin(PluginError::NotImplemented)).0,
            ttrpc::Code::UNIMPLEMENTED
        );
        assert_eq!(
            code(HandlerFailure::Plugin(PluginError::failed("no CPUs left"))),
            (ttrpc::Code::UNKNOWN, "no CPUs left".to_string())
        );
        assert_eq!(
            code(HandlerFailure::Timeout(Duration::from_secs(1))).0,
            ttrpc::Code::DEADLINE_EXCEEDED
        );
        let (c, m) = code(HandlerFailure::Panicked("x".into()));
        assert_eq!(c, ttrpc::Code::INTERNAL);
        assert!(
            m.contains("CreateContainer") && m.contains("panicked"),
            "{m}"
        );
    }
}
