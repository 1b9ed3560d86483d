//! Integer handles: a slot index and a generation in one `u64` (generation
//! in the high 32 bits, index in the low 32), in a table behind a mutex.
//! A freed slot's generation moves on, so a stale or doubly freed handle
//! is found out and refused; 0 is never a handle (generations start at 1).
//! A table made with [`Table::new_tagged`] sets the top bit of the index
//! part in its handles (and wants it set), so a handle of one table is
//! never live in an untagged one: a config handle given where a client's
//! is wanted is refused, and the other way round.
//!
//! Each entry is an `Arc<Mutex<T>>`: a call looks the handle up (holding
//! the table's lock only for that), then locks the entry itself, so calls
//! on different handles from different threads do not wait on each other,
//! and `free` during another thread's call on the same handle only drops
//! the table's reference (the object goes when that call ends).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Why a handle was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleError {
    /// Not a live handle.
    Bad,
    /// No slot left.
    Full,
}

struct Slot<T> {
    generation: u32,
    value: Option<Arc<Mutex<T>>>,
}

/// The table. Slots are reused (lowest free first) with a new generation.
pub struct Table<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    max: usize,
    /// [`TAG`] in every handle of this table, or 0.
    tag: u32,
}

/// The tag bit of a tagged table's handles (in the index part).
const TAG: u32 = 1 << 31;

/// Index, generation and tag bit of a handle.
fn split(h: u64) -> (usize, u32, u32) {
    let low = (h & 0xffff_ffff) as u32;
    ((low & !TAG) as usize, (h >> 32) as u32, low & TAG)
}

fn join(index: usize, generation: u32, tag: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index as u32 | tag)
}

impl<T> Table<T> {
    /// A table of at most `max` live handles.
    pub const fn new(max: usize) -> Table<T> {
        Table {
            slots: Vec::new(),
            free: Vec::new(),
            max,
            tag: 0,
        }
    }

    /// A table of at most `max` live handles, each with the tag bit set:
    /// none of them is ever a handle of an untagged table.
    pub const fn new_tagged(max: usize) -> Table<T> {
        Table {
            slots: Vec::new(),
            free: Vec::new(),
            max,
            tag: TAG,
        }
    }

    /// Puts `value` in and returns its handle.
    pub fn insert(&mut self, value: T) -> Result<u64, HandleError> {
        let value = Some(Arc::new(Mutex::new(value)));
        if let Some(i) = self.free.pop() {
            let slot = &mut self.slots[i as usize];
            slot.value = value;
            return Ok(join(i as usize, slot.generation, self.tag));
        }
        if self.slots.len() >= self.max || self.slots.len() >= TAG as usize {
            return Err(HandleError::Full);
        }
        self.slots.push(Slot { generation: 1, value });
        Ok(join(self.slots.len() - 1, 1, self.tag))
    }

    /// The entry of a live handle.
    pub fn get(&self, h: u64) -> Result<Arc<Mutex<T>>, HandleError> {
        let (i, generation, tag) = split(h);
        match self.slots.get(i) {
            Some(Slot {
                generation: g,
                value: Some(v),
            }) if *g == generation && tag == self.tag => Ok(Arc::clone(v)),
            _ => Err(HandleError::Bad),
        }
    }

    /// Takes a live handle's entry out; the handle is dead from now on.
    pub fn remove(&mut self, h: u64) -> Result<Arc<Mutex<T>>, HandleError> {
        let (i, generation, tag) = split(h);
        let slot = match self.slots.get_mut(i) {
            Some(s) if s.generation == generation && tag == self.tag && s.value.is_some() => s,
            _ => return Err(HandleError::Bad),
        };
        let v = slot.value.take().ok_or(HandleError::Bad)?;
        // Generation 0 is skipped so that no handle is ever 0.
        slot.generation = match slot.generation.wrapping_add(1) {
            0 => 1,
            g => g,
        };
        self.free.push(i as u32);
        // Lowest index first, so a program's handles stay small and stable.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
        Ok(v)
    }

    /// Live handles.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no handle is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Locks a mutex even if a panic poisoned it: every panic is caught at
/// the boundary and reported, and the data under these locks stays
/// consistent (the table is only changed by whole assignments).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_double_free_are_refused() {
        let mut t = Table::new(4);
        let a = t.insert("a").unwrap();
        assert_ne!(a, 0);
        assert_eq!(*lock(&t.get(a).unwrap()), "a");
        assert!(t.remove(a).is_ok());
        assert_eq!(t.remove(a).err(), Some(HandleError::Bad), "double free");
        assert_eq!(t.get(a).err(), Some(HandleError::Bad), "stale");
        // The slot is reused under a new generation; the old handle stays dead.
        let b = t.insert("b").unwrap();
        assert_eq!(b & 0xffff_ffff, a & 0xffff_ffff);
        assert_ne!(a, b);
        assert_eq!(t.get(a).err(), Some(HandleError::Bad));
        assert_eq!(*lock(&t.get(b).unwrap()), "b");
        assert_eq!(t.get(0).err(), Some(HandleError::Bad));
        assert_eq!(t.get(u64::MAX).err(), Some(HandleError::Bad));
    }

    #[test]
    fn full_table_is_an_error() {
        let mut t = Table::new(2);
        let a = t.insert(1).unwrap();
        t.insert(2).unwrap();
        assert_eq!(t.insert(3).err(), Some(HandleError::Full));
        t.remove(a).unwrap();
        assert!(t.insert(3).is_ok());
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn generation_wraps_past_zero() {
        let mut t = Table::new(1);
        t.slots.push(Slot {
            generation: u32::MAX,
            value: Some(Arc::new(Mutex::new(0))),
        });
        let h = join(0, u32::MAX, 0);
        t.remove(h).unwrap();
        let h2 = t.insert(1).unwrap();
        assert_eq!(h2 >> 32, 1);
    }

    #[test]
    fn a_tagged_tables_handles_are_never_an_untagged_ones() {
        let (mut plain, mut tagged) = (Table::new(4), Table::new_tagged(4));
        let a = plain.insert("client").unwrap();
        let b = tagged.insert("config").unwrap();
        // Same slot, same generation: only the tag tells them apart.
        assert_eq!((a & 0x7fff_ffff, a >> 32), (b & 0x7fff_ffff, b >> 32));
        assert_ne!(a, b);
        assert_eq!(plain.get(b).err(), Some(HandleError::Bad));
        assert_eq!(tagged.get(a).err(), Some(HandleError::Bad));
        assert_eq!(plain.remove(b).err(), Some(HandleError::Bad));
        assert_eq!(tagged.remove(a).err(), Some(HandleError::Bad));
        assert_eq!(*lock(&tagged.get(b).unwrap()), "config");
        assert!(tagged.remove(b).is_ok());
        assert_eq!(tagged.get(b).err(), Some(HandleError::Bad), "stale");
        assert_eq!(*lock(&plain.get(a).unwrap()), "client");
    }
}
