//! The one replay driver: a program (every allocation and free an emulated process makes, in
//! order, framed by its stages: [`program`]) run through the allocator model into the figures
//! PyTorch reports ([`driver`]), on an unlimited device or on a card whose allocator may use the
//! card's room less what the process holds outside it by then ([`outside`]). Replays are made
//! while the emulation writes the program ([`stream`]), the cards a budget is planned on replayed
//! beside it where its replay shows them needed ([`cards`]); layers written again from a record
//! are replayed without going through the small pool's blocks where its state repeats
//! ([`windows`]). Named tensors ([`named`]) and traces recorded on a GPU ([`trace`]) go through
//! the same driver.

pub mod cards;
pub mod driver;
mod live;
pub mod named;
pub mod outside;
pub mod program;
pub mod stream;
pub mod trace;
mod windows;

pub use cards::{Limited, Watched};
pub use driver::{Device, Driver, Replayed, Tag};
pub use named::{LiveBlock, NamedReplay, TensorId};
pub use outside::{Nccl, Outside, OutsideBytes};
pub use program::{Chunk, Event, Loaded, Program, Role, Stage, StageMark};
pub use stream::{replays, Plan, Replays};
pub use windows::ProgramReplay;
