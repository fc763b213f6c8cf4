//! What every page shares: its frame ([`Chrome`]), links to an event's page, and
//! reasons shortened for a table cell.

use super::super::console::Viewer;

/// Characters of a reason shown in a table cell (the event's page shows all of it).
pub(super) const REASON_SHOWN: usize = 160;

/// What every page's frame needs: who is logged in, whether they may act, where they are.
pub struct Chrome {
    pub who: String,
    pub can_act: bool,
    pub nav: &'static str,
}

impl Chrome {
    pub fn new(viewer: &Viewer, nav: &'static str) -> Chrome {
        Chrome { who: viewer.0.who.clone(), can_act: viewer.0.can_act(), nav }
    }
}

/// The page of event `id`.
pub fn link(id: &str) -> String {
    format!("/ui/event/{}", url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>())
}

pub(super) fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}
