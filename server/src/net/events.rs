//! What the file-system events of a watched directory mean: when a change is complete and
//! the files can be read. Shared by the config file source and the `dir:` Secret source.

use std::time::Duration;

use tokio::sync::mpsc;

/// What a file-system event says about the watched files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// A change is complete: a writer closed a file, or a name was renamed, removed or
    /// changed its metadata (a kubelet symlink swap is a rename).
    Done,
    /// A file was created: it is read once a writer closes it (or after [`CREATE_GRACE`],
    /// for what no writer closes, such as a new symlink).
    Created,
}

/// How long a created file may stay open before it is read anyway.
const CREATE_GRACE: Duration = Duration::from_secs(2);
/// Events closer together than this are one change (one save, one symlink swap).
const COALESCE: Duration = Duration::from_millis(15);

/// What an event means for a reload; `None` for events that change nothing or are only part
/// of a change. A write in place (truncate, write, close, as most editors and `echo > file`
/// do) is read once closed: reading on the data events in between could load a half-written
/// file, and an empty file is a valid, empty ToolSet. Opens and reads (our own included)
/// are not changes at all.
pub(crate) fn classify(kind: &notify::EventKind) -> Option<Signal> {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => Some(Signal::Done),
        EventKind::Access(_) | EventKind::Modify(ModifyKind::Data(_)) => None,
        EventKind::Create(CreateKind::File) => Some(Signal::Created),
        _ => Some(Signal::Done),
    }
}

/// Waits, after `first`, until the change it started is complete and the burst of events
/// is over. `false` when the watcher is gone.
pub(crate) async fn settle(first: Signal, rx: &mut mpsc::UnboundedReceiver<Signal>) -> bool {
    let mut created = (first == Signal::Created).then(|| tokio::time::Instant::now() + CREATE_GRACE);
    loop {
        let wait = created.map_or(COALESCE, |until| {
            until.saturating_duration_since(tokio::time::Instant::now())
        });
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(None) => return false,
            Ok(Some(Signal::Done)) => created = None,
            Ok(Some(Signal::Created)) => {
                created.get_or_insert_with(|| tokio::time::Instant::now() + CREATE_GRACE);
            }
            Err(_) => return true,
        }
    }
}
