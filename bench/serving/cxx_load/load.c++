// The C++ load generator of `python -m bench.serving.workers --load cxx`.
//
//     load HOST PORT CONNECTIONS IN_FLIGHT SECONDS WARMUP_SECONDS
//
// One thread, one KJ event loop, Cap'n Proto's own C++ RPC (TwoPartyClient): a client that
// costs the machine far less CPU per call than a Python one, so that the cores are left to
// the server under test. Its life, the driver's protocol (bench/serving/workers.py):
//
//  1. Open CONNECTIONS TCP connections to HOST:PORT, bootstrap `Echo` (schemas/echo.capnp)
//     on each and make one checked call on each (bounded by SETUP_TIMEOUT in all).
//  2. Print `READY` (no ports), flush, and block on fd 0 for one line (the start barrier,
//     bounded by SETUP_TIMEOUT): `GO` or `GO <instant>`, the instant being a
//     CLOCK_MONOTONIC time in seconds (Python's time.monotonic); with one, sleep until it.
//  3. Keep IN_FLIGHT `ping` calls in flight on every connection, a 16-character message,
//     each reply checked; every completion starts the next call on its connection. A call
//     that fails is an error, and its chain stops (no retry: a broken connection cannot
//     spin the loop).
//  4. WARMUP_SECONDS after the start, count: replies that arrive during the next SECONDS,
//     this process's CPU (getrusage RUSAGE_SELF, user + system) and wall time over that
//     window. Then print one JSON line
//     {"calls": N, "errors": E, "cpu_seconds": C, "wall_seconds": W}
//     and exit at once, leaving the calls still in flight.
//
// Errors during set-up go to stderr with exit status 1; the first few call errors are
// described on stderr as well. Everything waits on a time bound.

#include "echo.capnp.h"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/time.h>
#include <kj/vector.h>
#include <poll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr char MESSAGE[] = "xxxxxxxxxxxxxxxx";  // bench.serving.tls_echo.MESSAGE
static_assert(sizeof(MESSAGE) == 17, "a 16-character message");
constexpr double SETUP_TIMEOUT = 60.0;  // seconds: connecting, and waiting for the barrier
constexpr int MAX_CONNECTIONS = 4096;
constexpr int MAX_IN_FLIGHT = 100000;
constexpr double MAX_SECONDS = 86400.0;
constexpr int NOTED_ERRORS = 5;  // call errors described on stderr

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "load: %s\n", what);
  std::fflush(stderr);
  _exit(1);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "load: %s\nusage: load HOST PORT CONNECTIONS IN_FLIGHT SECONDS WARMUP_SECONDS\n",
               why);
  _exit(2);
}

long parseInteger(const char* text, long least, long most, const char* name) {
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < least || value > most) {
    std::fprintf(stderr, "load: %s must be an integer in %ld..%ld, not '%s'\n", name, least,
                 most, text);
    _exit(2);
  }
  return value;
}

double parseSeconds(const char* text, bool zeroAllowed, const char* name) {
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  bool ok = errno == 0 && end != text && *end == '\0' && std::isfinite(value) &&
            (zeroAllowed ? value >= 0 : value > 0) && value <= MAX_SECONDS;
  if (!ok) {
    std::fprintf(stderr, "load: %s must be a number of seconds %s 0 (at most %g), not '%s'\n",
                 name, zeroAllowed ? ">=" : ">", MAX_SECONDS, text);
    _exit(2);
  }
  return value;
}

double monotonicSeconds() {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

double cpuSeconds() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const struct timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

kj::Duration duration(double seconds) {
  return static_cast<int64_t>(std::llround(seconds * 1e9)) * kj::NANOSECONDS;
}

// The start barrier: one line from fd 0 (blocking; the event loop has nothing to do now).
// Returns the instant it names, or a negative number when it names none.
double readBarrier() {
  char line[256];
  size_t length = 0;
  double deadline = monotonicSeconds() + SETUP_TIMEOUT;
  for (;;) {  // bounded: the deadline, and the line's length
    double left = deadline - monotonicSeconds();
    if (left <= 0) fail("no start line on stdin within the set-up timeout");
    struct pollfd wanted = {0, POLLIN, 0};
    int ready = poll(&wanted, 1, static_cast<int>(std::ceil(left * 1e3)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      fail("poll on stdin failed");
    }
    if (ready == 0) continue;
    char byte;
    ssize_t got = read(0, &byte, 1);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail("reading stdin failed");
    }
    if (got == 0) fail("stdin closed before the start line");
    if (byte == '\n') break;
    if (length + 1 >= sizeof(line)) fail("the start line is too long");
    line[length++] = byte;
  }
  line[length] = '\0';
  if (std::strncmp(line, "GO", 2) != 0 || (line[2] != '\0' && line[2] != ' ')) {
    std::fprintf(stderr, "load: expected 'GO' or 'GO <instant>' on stdin, got '%s'\n", line);
    _exit(1);
  }
  const char* rest = line + 2;
  while (*rest == ' ') ++rest;
  if (*rest == '\0') return -1.0;
  errno = 0;
  char* end = nullptr;
  double instant = std::strtod(rest, &end);
  if (errno != 0 || end == rest || *end != '\0' || !std::isfinite(instant) || instant < 0) {
    std::fprintf(stderr, "load: the start line's instant is not a number: '%s'\n", line);
    _exit(1);
  }
  return instant;
}

void sleepUntil(double instant) {
  double left = instant - monotonicSeconds();
  if (left > SETUP_TIMEOUT) fail("the start instant is more than the set-up timeout away");
  if (left <= 0) return;
  struct timespec until;
  until.tv_sec = static_cast<time_t>(instant);
  until.tv_nsec = static_cast<long>((instant - static_cast<double>(until.tv_sec)) * 1e9);
  if (until.tv_nsec >= 1000000000L) until.tv_nsec = 999999999L;
  for (int i = 0; i < 1000; ++i) {  // EINTR only; the instant itself bounds the wait
    int status = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nullptr);
    if (status != EINTR) return;
  }
}

// The socket under one connection's TwoPartyClient, buffered both ways, so that this
// client puts on the wire what capsvc's own client does (capsvc/connection.py: one write
// per scheduler pass) and spends fewer system calls per call:
//  - writes are copied into a buffer and succeed at once; the buffer goes out in one write
//    two trips to the back of the event queue later (evalLater twice), once the events
//    queued so far have run. Cap'n Proto 0.9 writes each message on its own (the Finish of
//    a call answered, then the next Call: two writes, two segments for the server to read
//    per call); TwoPartyVatNetwork chains a connection's writes, and the Finish reaches
//    this buffer one trip after the Call does, so one trip sent them apart (measured: 144
//    then 40 bytes; with two, 184). A write failure fails every later write.
//  - reads take what the socket has (up to READ_BUFFER bytes) and hand it out, instead of
//    one read per message part (the 8-byte segment table first, then the rest).
class BufferedStream final : public kj::AsyncIoStream, private kj::TaskSet::ErrorHandler {
 public:
  explicit BufferedStream(kj::Own<kj::AsyncIoStream> inner)
      : inner(kj::mv(inner)), flushes(*this) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override {
    auto out = static_cast<kj::byte*>(buffer);
    size_t taken = take(out, maxBytes);
    if (taken >= minBytes) return taken;
    return readMore(out, taken, minBytes, maxBytes);
  }

  kj::Promise<void> write(const void* buffer, size_t size) override {
    KJ_IF_MAYBE(exception, failure) { return kj::cp(*exception); }
    auto bytes = static_cast<const kj::byte*>(buffer);
    pending.addAll(bytes, bytes + size);
    scheduleFlush();
    return kj::READY_NOW;
  }

  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    KJ_IF_MAYBE(exception, failure) { return kj::cp(*exception); }
    for (auto piece : pieces) pending.addAll(piece);
    scheduleFlush();
    return kj::READY_NOW;
  }

  kj::Promise<void> whenWriteDisconnected() override { return inner->whenWriteDisconnected(); }
  void shutdownWrite() override { inner->shutdownWrite(); }  // not used: this client exits
  void abortRead() override { inner->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override {
    inner->getsockname(addr, length);
  }
  void getpeername(struct sockaddr* addr, kj::uint* length) override {
    inner->getpeername(addr, length);
  }

 private:
  static constexpr size_t READ_BUFFER = 65536;

  kj::Own<kj::AsyncIoStream> inner;
  kj::Array<kj::byte> readBuffer = kj::heapArray<kj::byte>(READ_BUFFER);
  size_t readBegin = 0, readEnd = 0;  // the unread bytes of readBuffer
  kj::Vector<kj::byte> pending;       // written, not yet handed to the socket
  kj::Array<kj::byte> writing;        // handed to the socket, the write not done yet
  bool flushing = false;              // a flush is scheduled or under way
  kj::Maybe<kj::Exception> failure;
  kj::TaskSet flushes;

  size_t take(kj::byte* out, size_t most) {
    size_t n = kj::min(readEnd - readBegin, most);
    std::memcpy(out, readBuffer.begin() + readBegin, n);
    readBegin += n;
    return n;
  }

  kj::Promise<size_t> readMore(kj::byte* out, size_t got, size_t minBytes, size_t maxBytes) {
    // Here the buffer is empty (take() emptied it before got < minBytes).
    return inner->tryRead(readBuffer.begin(), 1, READ_BUFFER)
        .then([this, out, got, minBytes, maxBytes](size_t n) mutable -> kj::Promise<size_t> {
          if (n == 0) return got;  // end of stream
          readBegin = 0;
          readEnd = n;
          got += take(out + got, maxBytes - got);
          if (got >= minBytes) return got;
          return readMore(out, got, minBytes, maxBytes);
        });
  }

  void scheduleFlush() {
    if (flushing) return;  // the flush under way sends these bytes when it is done
    flushing = true;
    flushes.add(kj::evalLater([]() {})
                    .then([]() { return kj::evalLater([]() {}); })
                    .then([this]() { return flush(); }));
  }

  kj::Promise<void> flush() {
    if (pending.size() == 0) {
      flushing = false;
      return kj::READY_NOW;
    }
    writing = pending.releaseAsArray();
    return inner->write(writing.begin(), writing.size()).then([this]() { return flush(); });
  }

  void taskFailed(kj::Exception&& exception) override {
    flushing = false;
    failure = kj::mv(exception);
  }
};

struct Connection {
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<capnp::TwoPartyClient> rpc;
  Echo::Client echo = nullptr;
};

class Load final : public kj::TaskSet::ErrorHandler {
 public:
  Load() : tasks(*this) {}

  bool running = false;   // completions start the next call
  bool counting = false;  // inside the measured window
  uint64_t calls = 0;     // replies inside the window
  uint64_t errors = 0;    // failed calls (and wrong replies), from the start on

  // One call on `connection`; its completion starts the next while `running`.
  void call(Connection& connection) {
    auto request = connection.echo.pingRequest(capnp::MessageSize{8, 0});
    request.setMsg(MESSAGE);
    tasks.add(request.send().then(
        [this, &connection](capnp::Response<Echo::PingResults>&& response) {
          if (response.getReply() != MESSAGE) {
            error("the echo reply differs from the request");
            return;
          }
          if (counting) ++calls;
          if (running) call(connection);
        },
        [this](kj::Exception&& exception) { error(exception.getDescription().cStr()); }));
  }

  void taskFailed(kj::Exception&& exception) override {
    error(exception.getDescription().cStr());
  }

 private:
  kj::TaskSet tasks;

  void error(const char* what) {
    if (errors++ < NOTED_ERRORS) std::fprintf(stderr, "load: a call failed: %s\n", what);
  }
};

}  // namespace

int main(int argc, char* argv[]) {
  if (argc != 7) usage("expected 6 arguments");
  const char* host = argv[1];
  auto port = static_cast<unsigned>(parseInteger(argv[2], 1, 65535, "PORT"));
  auto connections = static_cast<int>(parseInteger(argv[3], 1, MAX_CONNECTIONS, "CONNECTIONS"));
  auto inFlight = static_cast<int>(parseInteger(argv[4], 1, MAX_IN_FLIGHT, "IN_FLIGHT"));
  double seconds = parseSeconds(argv[5], false, "SECONDS");
  double warmup = parseSeconds(argv[6], true, "WARMUP_SECONDS");

  try {
    kj::AsyncIoContext io = kj::setupAsyncIo();
    auto& waitScope = io.waitScope;
    auto& timer = io.provider->getTimer();

    // 1. Connect, bootstrap, one checked call on each connection.
    kj::Vector<kj::Own<Connection>> open;
    auto setUp = [&]() -> kj::Promise<void> {
      return io.provider->getNetwork()
          .parseAddress(host, port)
          .then([&](kj::Own<kj::NetworkAddress>&& address) {
            kj::Vector<kj::Promise<void>> each;
            for (int i = 0; i < connections; ++i) {
              open.add(kj::heap<Connection>());
              Connection& connection = *open.back();
              each.add(address->connect().then(
                  [&connection](kj::Own<kj::AsyncIoStream>&& stream) {
                    connection.stream = kj::heap<BufferedStream>(kj::mv(stream));
                    connection.rpc = kj::heap<capnp::TwoPartyClient>(*connection.stream);
                    connection.echo = connection.rpc->bootstrap().castAs<Echo>();
                    auto request = connection.echo.pingRequest();
                    request.setMsg(MESSAGE);
                    return request.send().then([](capnp::Response<Echo::PingResults>&& r) {
                      KJ_REQUIRE(r.getReply() == MESSAGE, "the echo reply differs");
                    });
                  }));
            }
            // The address must outlive the connects: keep it until they are all done.
            return kj::joinPromises(each.releaseAsArray()).attach(kj::mv(address));
          });
    };
    timer.timeoutAfter(duration(SETUP_TIMEOUT), setUp()).wait(waitScope);

    // 2. READY, then the barrier.
    std::fputs("READY\n", stdout);
    std::fflush(stdout);
    double instant = readBarrier();
    if (instant >= 0) sleepUntil(instant);

    // 3. The load. The timer's own notion of now is stale after the blocking wait: the
    // window is placed on the clock it follows instead.
    Load load;
    kj::TimePoint start = kj::systemPreciseMonotonicClock().now();
    load.running = true;
    for (auto& connection : open) {
      for (int i = 0; i < inFlight; ++i) load.call(*connection);
    }

    // 4. The window.
    timer.atTime(start + duration(warmup)).wait(waitScope);
    load.counting = true;
    double cpuBefore = cpuSeconds(), wallBefore = monotonicSeconds();
    timer.atTime(start + duration(warmup) + duration(seconds)).wait(waitScope);
    load.counting = false;
    load.running = false;
    double cpu = cpuSeconds() - cpuBefore, wall = monotonicSeconds() - wallBefore;
    std::printf("{\"calls\": %" PRIu64 ", \"errors\": %" PRIu64
                ", \"cpu_seconds\": %.6f, \"wall_seconds\": %.6f}\n",
                load.calls, load.errors, cpu, wall);
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(0);  // the calls still in flight are left as they are
  } catch (const kj::Exception& exception) {
    std::fprintf(stderr, "load: %s\n", exception.getDescription().cStr());
    std::fflush(stderr);
    _exit(1);
  }
}
