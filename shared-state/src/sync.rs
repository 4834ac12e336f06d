//! Locks that ignore poisoning.
//!
//! A lock is poisoned when a thread panicked while holding it. Every lock
//! in dra-cpu guards data that each critical section leaves consistent
//! before anything that could panic (or a plain value that is always
//! valid), so the data stays usable: refusing it would turn one panic into
//! a failure of every later caller, and hide the first one.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `mutex.lock()`, poisoned or not.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `lock.read()`, poisoned or not.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// `lock.write()`, poisoned or not.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Poison `f`'s lock by panicking while it is held.
    fn poison(f: impl FnOnce() + Send + std::panic::UnwindSafe) {
        let joined = std::thread::scope(|s| s.spawn(f).join());
        assert!(joined.is_err(), "the holder panicked");
    }

    #[test]
    fn a_poisoned_mutex_still_gives_its_data() {
        let mutex = Mutex::new(vec![1]);
        poison(|| {
            let mut guard = lock(&mutex);
            guard.push(2);
            panic!("holder panics");
        });
        assert!(mutex.is_poisoned());
        lock(&mutex).push(3);
        assert_eq!(*lock(&mutex), vec![1, 2, 3]);
    }

    #[test]
    fn a_poisoned_rwlock_still_reads_and_writes() {
        let rwlock = RwLock::new(1);
        poison(|| {
            let mut guard = write(&rwlock);
            *guard = 2;
            panic!("holder panics");
        });
        assert!(rwlock.is_poisoned());
        *write(&rwlock) += 1;
        assert_eq!(*read(&rwlock), 3);
    }
}
