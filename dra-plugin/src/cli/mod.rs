//! The subcommands besides `run`: `inspect` (the prepared claims and pools
//! of a running plugin), `topology` and `allocate` (the node and the
//! allocator, without a cluster), `slices` (the ResourceSlices this node
//! would publish).

mod inspect_marks;
pub mod inspect_state;
pub mod inspect_table;
pub mod node_state;
pub mod slices;
pub mod topology;
