//! The console's pages, one file each: what they show and where it comes from.
//! Every read is bounded: the overview uses counts kept as records change (no
//! scan), the events list reads at most `events::SCAN_BUDGET` records per page and
//! goes on from a cursor, and the dead groups read the dead and parked records only.

mod audit;
mod chrome;
mod event;
mod events;
mod groups;
mod login;
mod overview;

pub use audit::audit;
pub use event::event;
pub use events::events;
pub use groups::{group_ids, group_query, groups};
pub use login::{login_page, LoginPage};
pub use overview::{overview, overview_live};

pub use chrome::{link, Chrome};
