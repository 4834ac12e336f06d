//! Process plumbing both dra-cpu daemons share: the log format and set-up,
//! running until SIGTERM or SIGINT, the YAML config file and its layered
//! settings, the HTTP endpoints (`/metrics`, `/healthz`, `/readyz`) and the
//! Prometheus text exposition. The pure core (CPU sets,
//! allocation, pools, the store) stays in `shared-state`.

pub mod config_file;
pub mod daemon;
pub mod exposition;
pub mod http;
pub mod upstream_metrics;
