//! One render of the exposition at a time, shared by the scrapes that waited
//! for it.
//!
//! With many partitions a render builds tens of megabytes of text (9,600
//! partitions: about 70 MB, and more than that again while it is built), on a
//! thread of its own per scrape. Scrapes that arrive together would each build
//! their own, and a handful of them held gigabytes at once. So renders take
//! turns, node-wide, and a scrape that waited while another render ran takes
//! the next render as its answer if that render began after the scrape was
//! asked for (its figures are then as fresh as its own would be). Only a weak
//! reference to the last text is kept: once every scrape that shares it has
//! been sent, its memory goes.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

/// The node's one render slot; see the module documentation.
pub struct SharedRender {
    last: Mutex<Option<LastRender>>,
}

struct LastRender {
    started: Instant,
    text: Weak<String>,
}

impl SharedRender {
    pub const fn new() -> SharedRender {
        SharedRender {
            last: Mutex::new(None),
        }
    }

    /// The exposition for a scrape asked for at `asked`: the last render, if
    /// it began at or after `asked` and is still held by a scrape being
    /// answered, else a new one made by `render`, which waits for a render in
    /// progress to finish first.
    pub fn text(&self, asked: Instant, render: impl FnOnce() -> String) -> Arc<String> {
        // Poisoned only by a render that panicked: the slot itself is sound.
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let fresh = last
            .as_ref()
            .filter(|l| l.started >= asked)
            .and_then(|l| l.text.upgrade());
        if let Some(text) = fresh {
            return text;
        }
        let started = Instant::now();
        let text = Arc::new(render());
        *last = Some(LastRender {
            started,
            text: Arc::downgrade(&text),
        });
        text
    }
}

/// The node's render slot, shared by every shard's scrapes.
pub static SHARED_RENDER: SharedRender = SharedRender::new();

/// A shared text as the bytes of a response body.
pub struct SharedText(pub Arc<String>);

impl AsRef<[u8]> for SharedText {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::time::Duration;

    #[test]
    fn scrapes_that_waited_share_the_render_that_began_after_them() {
        let slot = SharedRender::new();
        let renders = Cell::new(0);
        let render = || {
            renders.set(renders.get() + 1);
            format!("render {}", renders.get())
        };
        // Asked before the first render began: it is theirs too.
        let asked = Instant::now();
        let first = slot.text(asked, render);
        let waited = slot.text(asked, render);
        assert_eq!((first.as_str(), waited.as_str()), ("render 1", "render 1"));
        assert!(Arc::ptr_eq(&first, &waited), "one text, not a copy");
        // Asked after it began: a render of its own.
        std::thread::sleep(Duration::from_millis(2));
        let later = slot.text(Instant::now(), render);
        assert_eq!(later.as_str(), "render 2");
        // Nothing is kept once no scrape holds the text.
        drop((first, waited, later));
        assert_eq!(slot.text(asked, render).as_str(), "render 3");
    }
}
