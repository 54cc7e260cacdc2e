//! A bounded reader of `text/event-stream` bodies: the `data` of each event.

/// Splits a byte stream into events' data. Lines and events are bounded by `max` bytes.
#[derive(Debug)]
pub(super) struct Events {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    max: usize,
}

impl Events {
    pub(super) fn new(max: usize) -> Self {
        Self {
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            max,
        }
    }

    /// Feeds a chunk; pushes the data of every event it completes onto `out`.
    ///
    /// # Errors
    /// An event or line over the bound.
    pub(super) fn feed(&mut self, chunk: &[u8], out: &mut Vec<Vec<u8>>) -> Result<(), String> {
        for &b in chunk {
            if b != b'\n' {
                if self.line.len() >= self.max {
                    return Err(format!("an event over {} bytes", self.max));
                }
                self.line.push(b);
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            if self.line.is_empty() {
                if self.has_data {
                    out.push(std::mem::take(&mut self.data));
                    self.has_data = false;
                }
                continue;
            }
            if let Some(rest) = self.line.strip_prefix(b"data") {
                let value = match rest {
                    [] => &[][..],
                    [b':', b' ', v @ ..] | [b':', v @ ..] => v,
                    _ => {
                        self.line.clear();
                        continue;
                    }
                };
                if self.has_data {
                    self.data.push(b'\n');
                }
                if self.data.len() + value.len() > self.max {
                    return Err(format!("an event over {} bytes", self.max));
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            self.line.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_however_the_bytes_arrive() {
        let stream = b": comment\r\nevent: message\r\nid: 1\r\ndata: {\"a\":\r\ndata:1}\r\n\r\ndata: x\n\nretry: 5\n\n";
        for size in [1, 3, 7, stream.len()] {
            let mut e = Events::new(64);
            let mut out = Vec::new();
            for chunk in stream.chunks(size) {
                e.feed(chunk, &mut out).unwrap();
            }
            assert_eq!(
                out,
                vec![b"{\"a\":\n1}".to_vec(), b"x".to_vec()],
                "chunks of {size}"
            );
        }
    }

    #[test]
    fn events_are_bounded() {
        let mut out = Vec::new();
        assert!(Events::new(8).feed(b"data: 0123456789\n\n", &mut out).is_err());
        assert!(
            Events::new(8)
                .feed(b"data: 0123\ndata: 4567\n", &mut out)
                .is_err()
        );
        assert!(Events::new(8).feed(&[b'x'; 100], &mut out).is_err());
    }
}
