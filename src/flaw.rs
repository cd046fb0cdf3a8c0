//! The switches a loom model's broken twin turns on in the real code
//! (`cfg(loom)` only): which step of which protocol runs broken, and how
//! many shards a model's maps have. A leaf: the code that reads a switch
//! imports nothing else of the models' (`loom_api`) to do so.

/// A deliberately broken step of a real protocol, switched on by a model's
/// broken twin with [`with_flaw`]: the twin then runs the real code with
/// that one step replaced, and passes only if loom finds the bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Flaw {
    /// The automatic sweep's flag is taken with a load, then a store,
    /// instead of one swap: two creations can both take a step at once.
    SweepFlagCheckThenSet,
    /// The automatic sweep's flag is taken and released `Relaxed`: the
    /// next holder may read the cursor and pass bookkeeping as they were
    /// before the previous step.
    SweepFlagRelaxed,
    /// A read of the live quota skips its `Acquire` fence: the second
    /// version load may then miss a store whose words the read saw.
    QuotaReadWithoutFence,
    /// A keyed call reads the limiter's initial quota whatever the live
    /// quota's version says: a call made after a store (and synchronised
    /// with it) still decides under the old quota.
    QuotaInitialAlways,
    /// The map looks a new key up under one lock and inserts it under
    /// another, without looking again: two first calls each install (and
    /// spend from) their own bucket.
    InsertWithoutRecheck,
    /// A place under the bucket cap is reserved by a load, a comparison,
    /// then an add, instead of one `fetch_add` whose result decides.
    ReserveCheckThenAdd,
    /// Eviction retires a moved bucket without asking whether a live
    /// handle pins it.
    EvictIgnoringHandles,
    /// A thread takes a new slot index by reading the next one under the
    /// slots' lock and claiming it under another: two threads can get the
    /// same index, and write one counter stripe each thinking it the only
    /// writer.
    SlotTakenInTwoLocks,
    /// A bucket is retired by a load, a fullness check and a blind store
    /// of `RETIRED`, instead of a compare-and-swap: a spend that lands in
    /// between (from a hot-key cache, which holds no lock) is swallowed.
    RetireByBlindStore,
    /// A bucket's spend loads its word, decides, then stores the new word,
    /// instead of one compare-and-swap: two spends can decide on the same
    /// word, and the later store erases the earlier debit or, for a spend
    /// stamped earlier, moves the bucket's clock backwards.
    SpendByLoadThenStore,
    /// An operator's reset stores 0 (full) whatever the word holds,
    /// instead of a compare-and-swap that leaves the marker words alone:
    /// it revives a bucket the sweep has retired and removed from its map.
    ResetByPlainStore,
    /// A sweep removes a bucket without keeping its word for the key's
    /// return: the key starts full again, and a call stamped before the
    /// sweep's timestamp spends tokens that bucket did not hold.
    RemovedWordForgotten,
    /// A bucket's retirement checks that it is full and reports it retired
    /// without writing `RETIRED`: a map whose readers take no lock removes
    /// it while a spend that already found it still lands on it.
    RetireWithoutMarking,
    /// A concurrency permit is taken by a load, a check against the
    /// limit, then an add, instead of a compare-and-swap from the value
    /// checked: two takers can both see room for one.
    PermitTakeCheckThenAdd,
    /// A concurrency permit is given back by a load, then a store of one
    /// less, instead of one `fetch_sub`: two racing releases (or a release
    /// and a take) lose an update, and the count drifts from the holders.
    PermitReleaseByLoadThenStore,
    /// The concurrency sweep removes a slot whose count reads 0 without
    /// retiring it: a waiter that found the slot before takes a permit on
    /// it that the map no longer counts, while another caller takes one
    /// on a fresh slot.
    PermitSlotRemovedWithoutRetiring,
    /// A queued waiter that gives up and is no longer in the queue reports
    /// no permit, although a release served it one first: the granted
    /// permit is held by nobody, and the key stays one permit short.
    CancelDroppingAGrant,
    /// A compound call checks every quota under its bucket's lock, lets
    /// it go, then spends one quota at a time, each under its own lock:
    /// two calls can both pass the check, and spend partially.
    CompoundCheckThenSpend,
    /// A compound call takes its buckets' locks in the call's order of
    /// scopes, not the global one: two calls on the same keys in opposite
    /// orders can each hold one lock and wait for the other.
    CompoundLockInCallOrder,
    /// A compound cell's lock-free read keeps the words it loaded without
    /// loading the state again: a read that raced an admission's stores
    /// decides on torn words (some written, some not), and its denial
    /// reports a wait that no sequential order gives.
    CompoundReadWithoutRecheck,
    /// A compound call of several cached scopes reads its cells one after
    /// another, each with its own consistent read (state, words, state),
    /// instead of loading every state before every second load: an
    /// admission that writes two of the cells can land between two reads,
    /// and the denial, decided on one cell from before it and one from
    /// after, reports a wait and a binding scope that no sequential order
    /// gives.
    CompoundSnapshotCellByCell,
    /// A compound cell's lock is taken even when the cell is retired: a
    /// cached call spends on a cell the sweep has removed from the map,
    /// and the spend is lost.
    CompoundSpendIgnoringRetired,
    /// At the cap, the compound store's room-making sweep trusts its
    /// shard's bound (the instant from which a cell there can be full)
    /// and removes the shard's cells without looking at their words: a
    /// bucket spent since the bound was set is removed, and its spend is
    /// lost.
    CompoundRoomTrustsBound,
    /// A thread's memo of a cached compound cell's last denial is trusted
    /// without checking that no write landed on the cell since: after an
    /// admission on the key, a call is denied with the wait and the
    /// binding quota of the words before it.
    CompoundMemoIgnoringState,
}

std::thread_local! {
    // Plain `std` thread-locals, on purpose: loom runs a model's threads
    // as coroutines on the OS thread that calls `loom::model`, so every
    // thread of the model sees what the test set, and other tests (on
    // other OS threads) do not.
    static FLAW: std::cell::Cell<Option<Flaw>> = const { std::cell::Cell::new(None) };
    static SHARDS: std::cell::Cell<usize> = const { std::cell::Cell::new(1) };
}

/// Resets a thread-local setting when dropped, even by a twin's panic.
struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<std::cell::Cell<T>>, T);

impl<T: Copy + 'static> Drop for Restore<T> {
    fn drop(&mut self) {
        self.0.with(|cell| cell.set(self.1));
    }
}

/// Runs `f` (a `loom::model` call) with `flaw` switched on in the real code.
pub fn with_flaw<R>(flaw: Flaw, f: impl FnOnce() -> R) -> R {
    let _restore = Restore(&FLAW, FLAW.with(|cell| cell.replace(Some(flaw))));
    f()
}

/// Whether a broken twin switched `flaw` on (see [`with_flaw`]).
pub(crate) fn flawed(flaw: Flaw) -> bool {
    FLAW.with(|cell| cell.get() == Some(flaw))
}

/// Runs `f` (a `loom::model` call) with limiters whose map has `shards`
/// shards (1 otherwise): the automatic sweep then takes `shards` steps a
/// pass, one shard each, and its cursor moves.
pub fn with_shards<R>(shards: usize, f: impl FnOnce() -> R) -> R {
    assert!(shards >= 1, "a map has at least one shard");
    let _restore = Restore(&SHARDS, SHARDS.with(|cell| cell.replace(shards)));
    f()
}

/// The shards of a map made now (see [`with_shards`]).
pub(crate) fn shards() -> usize {
    SHARDS.with(std::cell::Cell::get)
}
