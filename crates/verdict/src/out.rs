//! What the command line writes to its standard output: through here, so
//! that a reader that goes away (`verdict flows --follow | head`) ends
//! the command quietly, as a pipeline expects, instead of a panic.

use std::io::Write as _;

/// The reader of standard output went away: the command is done.
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed")]
pub struct Closed;

/// Writes `text` to standard output and flushes it. A closed pipe is
/// [`Closed`]; any other failure is said.
pub fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Closed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to standard output")),
    }
}

/// [`print`] with a line break after `text`.
pub fn println(text: &str) -> anyhow::Result<()> {
    print(&format!("{text}\n"))
}

/// Whether an error is [`Closed`] (the command then ends quietly, with
/// success).
pub fn is_closed(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Closed>().is_some()
}
