// Per-object, per-thread call gates (docs/contract.md, "Threading").
//
// Under the GIL a method is atomic as long as it runs no Python code between
// deciding what to do and doing it. A few windows must run Python there: an
// engine object's setters, written back before a pool commits what they
// describe, and a unit owner's __hash__ / __eq__ while the owner table
// interns it. Other threads may run meanwhile. Such a window holds its
// object's gate: a call on that object from another thread waits, with the
// GIL released, until the window closes; the holding thread passes (what it
// does from inside its own window, a re-entrant setter say, is the window's
// business to detect). So one thread's window never makes another thread's
// legitimate call fail, and no thread sees a window half done.
//
// A window must not wait for another thread's call on the same object (a
// setter that joins a thread calling the pool would wait forever, as it would
// on any lock); gates are held only around engine-supplied setters and
// owner hashing, never around notifications (on_evict, clocks, tier votes),
// which run once their object is consistent and may wait on anything.
#pragma once

#include <Python.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace statecache::bindings {

class CallGate {
 public:
  // Returns (with the GIL) once no other thread holds this gate. Waits with
  // the GIL released.
  void wait_turn() {
    const unsigned long me = PyThread_get_thread_ident();
    while (holder_ != 0 && holder_ != me) {
      const uint64_t seen = releases().load();
      ++waiters_;
      Py_BEGIN_ALLOW_THREADS;
      {
        std::unique_lock<std::mutex> lock(mutex());
        cond().wait(lock, [seen] { return releases().load() != seen; });
      }
      Py_END_ALLOW_THREADS;
      --waiters_;
    }
  }
  bool held_by_this_thread() const { return holder_ != 0 && holder_ == PyThread_get_thread_ident(); }
  bool held() const { return holder_ != 0; }

  // Holds the gate for the calling thread (waiting its turn first) until it
  // goes out of scope; nests within one thread.
  class Hold {
   public:
    explicit Hold(CallGate& g) : g_(g) {
      g_.wait_turn();
      g_.holder_ = PyThread_get_thread_ident();
      ++g_.depth_;
    }
    ~Hold() {
      if (--g_.depth_ == 0) g_.open();
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    CallGate& g_;
  };

 private:
  void open() {
    holder_ = 0;
    if (waiters_ == 0) return;
    {
      std::lock_guard<std::mutex> lock(mutex());
      releases().fetch_add(1);
    }
    cond().notify_all();
  }
  // One wake-up channel for every gate: waiting is rare, and a waiter that
  // wakes for another gate looks again.
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::condition_variable& cond() {
    static std::condition_variable c;
    return c;
  }
  static std::atomic<uint64_t>& releases() {
    static std::atomic<uint64_t> r{0};
    return r;
  }

  // Read and written with the GIL held only. No initialisers: a gate lives
  // zeroed in an instance's memory (fast::instance_setup) or is value-initialised.
  unsigned long holder_;  // PyThread_get_thread_ident() of the holder; 0: open
  uint32_t depth_;
  uint32_t waiters_;
};

}  // namespace statecache::bindings
