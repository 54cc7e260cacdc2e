//! State the server keeps beside a compiled value without the model knowing its type: the
//! token cache of an OAuth2 grant is a tokio mutex, and the model links no runtime.

use std::any::Any;
use std::fmt;
use std::sync::OnceLock;

/// A value set once by the runtime on first use and read by it afterwards. The model never
/// reads it, so a compiled value stays plain data.
#[derive(Default)]
pub struct RuntimeSlot(OnceLock<Box<dyn Any + Send + Sync>>);

impl RuntimeSlot {
    /// The value, made by `init` on first use. `None` when the slot already holds a value of
    /// another type (one runtime owns a slot, so that is a bug, not an input).
    pub fn get_or_init<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Option<&T> {
        self.0.get_or_init(|| Box::new(init())).downcast_ref()
    }
}

impl fmt::Debug for RuntimeSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "RuntimeSlot(set)"
        } else {
            "RuntimeSlot(empty)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::RuntimeSlot;

    #[test]
    fn a_slot_keeps_its_first_value_and_refuses_another_type() {
        let slot = RuntimeSlot::default();
        assert_eq!(slot.get_or_init(|| 7u32), Some(&7));
        assert_eq!(slot.get_or_init(|| 9u32), Some(&7));
        assert_eq!(slot.get_or_init(|| "text"), None);
    }
}
