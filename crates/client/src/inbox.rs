//! The inbox: received DATA waiting for [`crate::Client::recv`], in slots
//! allocated once at start.

use reflector_proto::protocol::MAX_GAME_PAYLOAD;

/// One received DATA held in the inbox.
pub(crate) struct Slot {
    pub(crate) group: u16,
    pub(crate) sender: u32,
    pub(crate) instance: u64,
    pub(crate) seq: u64,
    pub(crate) len: usize,
    pub(crate) buf: Box<[u8; MAX_GAME_PAYLOAD]>,
}

/// Received DATA waiting for [`Client::recv`]: fixed slots allocated at
/// start, so receiving never allocates.
pub(crate) struct Inbox {
    pub(crate) slots: Vec<Slot>,
    pub(crate) head: usize,
    pub(crate) len: usize,
}

impl Inbox {
    pub(crate) fn new(n: usize) -> Inbox {
        let slots = (0..n.max(1))
            .map(|_| Slot {
                group: 0,
                sender: 0,
                instance: 0,
                seq: 0,
                len: 0,
                buf: Box::new([0; MAX_GAME_PAYLOAD]),
            })
            .collect();
        Inbox { slots, head: 0, len: 0 }
    }

    pub(crate) fn push(&mut self) -> Option<&mut Slot> {
        if self.len == self.slots.len() {
            return None;
        }
        let i = (self.head + self.len) % self.slots.len();
        self.len += 1;
        Some(&mut self.slots[i])
    }

    pub(crate) fn pop(&mut self) -> Option<&Slot> {
        if self.len == 0 {
            return None;
        }
        let i = self.head;
        self.head = (self.head + 1) % self.slots.len();
        self.len -= 1;
        Some(&self.slots[i])
    }
}
