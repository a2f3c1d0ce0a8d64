#include "core/base/socket_server.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>

#include "core/base/log.h"
#include "core/base/unix_socket.h"

namespace vmmshim {
namespace {

struct Shared {
  SocketServer::Options options;
  SocketServer::Handler handler;
  std::atomic<int> active{0};
  // The accept loop's own: refusals not yet logged, and when it last logged.
  uint64_t refused = 0;
  std::chrono::steady_clock::time_point last_refusal_log;
};

void CloseAnswered(int conn, std::chrono::milliseconds wait);

void RefuseBusy(const Shared& s, int conn) {
  if (!s.options.busy_reply.empty()) {
    WriteAll(conn, s.options.busy_reply.data(), s.options.busy_reply.size());
  }
  // What the client sent already is read; the accept loop waits for no more.
  CloseAnswered(conn, std::chrono::milliseconds(0));
}

// Closes a connection whose reply is written. A Unix socket closed with
// unread bytes (a request the handler refused without reading) resets the
// peer, which then loses the reply it has not read yet: the rest of the
// request is read first (at most 64 KiB, what arrives within `wait`).
void CloseAnswered(int conn, std::chrono::milliseconds wait) {
  shutdown(conn, SHUT_WR);
  const Deadline deadline = std::chrono::steady_clock::now() + wait;
  char sink[4096];
  for (int i = 0; i < 16; ++i) {
    const ssize_t got = wait.count() > 0 ? ReceiveBefore(conn, sink, sizeof sink, deadline)
                                         : recv(conn, sink, sizeof sink, MSG_DONTWAIT);
    if (got <= 0) break;
  }
  close(conn);
}

void Serve(std::shared_ptr<Shared> s, int listen_fd) {
  for (;;) {
    const int conn = AcceptConnection(listen_fd, s->options.io_timeout_seconds);
    if (conn < 0) {
      Log().error("{} stops: accept: {}", s->options.name, std::strerror(errno));
      close(listen_fd);
      return;
    }
    ucred peer = {};
    peer.uid = static_cast<uid_t>(-1);
    peer.gid = static_cast<gid_t>(-1);
    socklen_t len = sizeof peer;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
      peer = {0, static_cast<uid_t>(-1), static_cast<gid_t>(-1)};
    }
    if (s->active.fetch_add(1, std::memory_order_acq_rel) >= s->options.max_connections) {
      s->active.fetch_sub(1, std::memory_order_acq_rel);
      // At most one line a second: a client that reconnects in a loop must
      // not fill the log (or the disk under VMMSHIM_LOG_FILE).
      ++s->refused;
      const auto now = std::chrono::steady_clock::now();
      if (now - s->last_refusal_log >= std::chrono::seconds(1)) {
        Log().warn("{}: {} connections are being served; {} refused as busy since the last "
                   "such line (the latest from pid {}, uid {})",
                   s->options.name, s->options.max_connections, s->refused, peer.pid, peer.uid);
        s->refused = 0;
        s->last_refusal_log = now;
      }
      RefuseBusy(*s, conn);
      continue;
    }
    try {
      // The thread inherits this one's mask: every signal blocked.
      std::thread([s, conn, peer] {
        s->handler(conn, peer);
        CloseAnswered(conn, std::chrono::milliseconds(100));
        s->active.fetch_sub(1, std::memory_order_acq_rel);
      }).detach();
    } catch (const std::system_error& e) {
      s->active.fetch_sub(1, std::memory_order_acq_rel);
      Log().warn("{}: no thread for a connection ({}); refused as busy", s->options.name,
                 e.what());
      RefuseBusy(*s, conn);
    }
  }
}

}  // namespace

bool SocketServer::Start(int listen_fd, Options options, Handler handler) {
  auto shared = std::make_shared<Shared>();
  shared->options = std::move(options);
  shared->handler = std::move(handler);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  bool started = true;
  try {
    std::thread(&Serve, std::move(shared), listen_fd).detach();
  } catch (const std::system_error& e) {
    started = false;
    close(listen_fd);
    errno = e.code().value();
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return started;
}

}  // namespace vmmshim
