// Rendezvous: parsing and probing specs, the stores behind them (Redis with
// its password), the address a rank's transport binds to, and telling which
// peer machines still answer after a collective failed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <hiredis/hiredis.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "runtime/core/error.h"
#include "runtime/distributed/store.h"

namespace fanout::distributed {

namespace fs = std::filesystem;

std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  // Gloo puts "[path/file.cc:LINE] " before the cause.
  const auto open = line.find('['), close = line.find("] ");
  if (open != std::string::npos && close != std::string::npos && open < close &&
      line.find(".cc:", open) < close)
    line = line.substr(0, open) + line.substr(close + 2);
  return line;
}

Rendezvous Rendezvous::parse(const std::string& spec) {
  Rendezvous r;
  if (spec.rfind("file:", 0) == 0) {
    r.kind = Kind::File;
    r.path = spec.substr(5);
    FANOUT_USER_CHECK(!r.path.empty()) << "bad rendezvous '" << spec << "': file: needs a directory (file:DIR)";
    return r;
  }
  if (spec.rfind("redis:", 0) == 0) {
    r.kind = Kind::Redis;
    const std::string rest = spec.substr(6);
    const auto colon = rest.rfind(':');
    FANOUT_USER_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < rest.size())
        << "bad rendezvous '" << spec << "': expected redis:HOST:PORT";
    r.host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1);
    FANOUT_USER_CHECK(port.find_first_not_of("0123456789") == std::string::npos && port.size() <= 5 &&
                      std::stoi(port) >= 1 && std::stoi(port) <= 65535)
        << "bad rendezvous '" << spec << "': port '" << port << "' is not in 1..65535";
    r.port = std::stoi(port);
    if (const char* pw = std::getenv("FANOUT_RDZV_PASSWORD")) r.password = pw;
    return r;
  }
  FANOUT_FAIL() << "bad rendezvous '" << spec << "' (expected file:DIR or redis:HOST:PORT)";
}

std::string Rendezvous::str() const {
  return kind == Kind::File ? "file:" + path : "redis:" + host + ":" + std::to_string(port);
}

namespace {

timeval to_timeval(double s) {
  return timeval{static_cast<time_t>(s), static_cast<suseconds_t>((s - static_cast<time_t>(s)) * 1e6)};
}

// Where the password came from, for errors: the file --rdzv-password-file
// read (it passes the password on in FANOUT_RDZV_PASSWORD), or the variable.
std::string password_source() {
  const char* file = std::getenv("FANOUT_RDZV_PASSWORD_FILE");
  return file && *file ? std::string("--rdzv-password-file ") + file : "FANOUT_RDZV_PASSWORD";
}

// Redis's protected-mode refusal (DENIED ..., a paragraph) in one line.
std::string refusal(const std::string& s) {
  return s.rfind("DENIED", 0) == 0 ? "the server refuses other hosts (Redis's protected mode: start it with "
                                     "requirepass, or --protected-mode no on a trusted network)"
                                   : s;
}

// Sends AUTH when a password is set; "" when the server took it, else why not.
std::string authenticate(redisContext* c, const Rendezvous& r) {
  if (r.password.empty()) return "";
  auto* reply = static_cast<redisReply*>(redisCommand(c, "AUTH %s", r.password.c_str()));
  std::string err;
  if (reply == nullptr) {
    // A read that timed out (EAGAIN): something accepted the connection and never answered.
    const bool silent = c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
    err = silent   ? "no reply to AUTH within the timeout (is a Redis server listening there?)"
          : c->err ? c->errstr
                   : "no reply to AUTH";
  } else if (reply->type == REDIS_REPLY_ERROR) {
    const std::string s = reply->str;
    err = s.find("without any password configured") != std::string::npos
              ? "a password is given (" + password_source() + ") but the server has none (start it with requirepass)"
          : s.rfind("DENIED", 0) == 0 ? refusal(s)
                                      : "it refused the password in " + password_source() + " (" + s + ")";
  }
  if (reply) freeReplyObject(reply);
  return err;
}

// Gloo's RedisStore, authenticated before its first command.
class AuthRedisStore : public gloo::rendezvous::RedisStore {
 public:
  explicit AuthRedisStore(const Rendezvous& r) : RedisStore(r.host, r.port) {
    const std::string err = authenticate(redis_, r);
    FANOUT_USER_CHECK(err.empty()) << "the Redis rendezvous at " << r.host << ":" << r.port << ": " << err;
  }
};

}  // namespace

void probe_rendezvous(const Rendezvous& r, double timeout_s) {
  if (r.kind == Rendezvous::Kind::File) {
    std::error_code ec;
    fs::create_directories(r.path, ec);
    FANOUT_USER_CHECK(!ec && fs::is_directory(r.path))
        << "rendezvous directory " << r.path << " cannot be created: " << ec.message();
    const std::string probe = r.path + "/.probe." + std::to_string(::getpid());
    std::ofstream(probe) << "x";
    const bool ok = fs::exists(probe);
    fs::remove(probe, ec);
    FANOUT_USER_CHECK(ok) << "rendezvous directory " << r.path << " is not writable";
    return;
  }
  const timeval tv = to_timeval(std::min(timeout_s, 10.0));
  redisContext* c = redisConnectWithTimeout(r.host.c_str(), r.port, tv);
  std::string err;
  bool reached = false;
  if (c == nullptr) {
    err = "out of memory";
  } else if (c->err) {
    err = c->errstr;
  } else {
    reached = true;
    redisSetTimeout(c, tv);
    err = authenticate(c, r);
    if (err.empty()) {
      auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
      if (reply == nullptr && c->err == REDIS_ERR_PROTOCOL) {
        // Something answered, not in Redis's protocol: a web server, another service on the port.
        err = std::string("what answers there is not a Redis server (") + c->errstr + "): check the host and port";
      } else if (reply == nullptr) {
        err = "no reply to PING within " + std::to_string(static_cast<int>(std::ceil(std::min(timeout_s, 10.0)))) +
              " s" + (c->err ? std::string(" (") + c->errstr + ")" : "");
      } else if (reply->type == REDIS_REPLY_ERROR) {
        const std::string s = reply->str;
        err = s.rfind("NOAUTH", 0) == 0
                  ? "it needs a password: give it in FANOUT_RDZV_PASSWORD or with --rdzv-password-file"
                  : refusal(s);
      }
      if (reply) freeReplyObject(reply);
    }
  }
  if (c) redisFree(c);
  FANOUT_USER_CHECK(err.empty()) << "cannot " << (reached ? "use" : "reach") << " the Redis rendezvous at " << r.host
                                 << ":" << r.port << ": " << err;
}

namespace {
// Gloo's FileStore with what it keeps protected reachable: whether keys are
// set (check), and a key removed as the Redis store's DEL removes it.
struct OurFileStore : gloo::rendezvous::FileStore {
  using gloo::rendezvous::FileStore::FileStore;
  using gloo::rendezvous::FileStore::check;
  void forget(const std::string& key) {
    std::error_code ec;
    fs::remove(objectPath(key), ec);
  }
};

// A run's keys in a store: PrefixStore keeps a reference, the shared_ptr
// keeps `base` alive with it. Waits without a timeout (connectFullMesh's,
// get's) get ours instead of Gloo's 30 s.
struct RunStore : gloo::rendezvous::PrefixStore {
  RunStore(const std::string& p, std::shared_ptr<gloo::rendezvous::Store> b, std::chrono::milliseconds t)
      : gloo::rendezvous::PrefixStore(p, *b), base(std::move(b)), timeout(t) {}
  void wait(const std::vector<std::string>& keys) override { PrefixStore::wait(keys, timeout); }
  using PrefixStore::wait;
  std::vector<char> get(const std::string& key) override {
    PrefixStore::wait({key}, timeout);
    return PrefixStore::get(key);
  }
  // Whether the key is set now, without waiting.
  bool has(const std::string& key) {
    if (auto* f = dynamic_cast<OurFileStore*>(base.get())) return f->check({joinKey(key)});
    if (auto* r = dynamic_cast<gloo::rendezvous::RedisStore*>(base.get())) return r->check({joinKey(key)});
    return true;
  }
  std::shared_ptr<gloo::rendezvous::Store> base;
  std::chrono::milliseconds timeout;
};
}  // namespace

std::vector<std::string> missing_keys(gloo::rendezvous::Store& store, const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  auto* run = dynamic_cast<RunStore*>(&store);
  for (const std::string& k : keys)
    if (run && !run->has(k)) out.push_back(k);
  return out;
}

std::shared_ptr<gloo::rendezvous::Store> open_store(const Rendezvous& r, const std::string& run_id,
                                                    double timeout_s) {
  std::shared_ptr<gloo::rendezvous::Store> base;
  try {
    if (r.kind == Rendezvous::Kind::File)
      base = std::make_shared<OurFileStore>(r.path);
    else
      base = std::make_shared<AuthRedisStore>(r);
  } catch (const fanout::Error&) {
    throw;
  } catch (const std::exception& e) {
    FANOUT_FAIL() << "cannot open the rendezvous " << r.str() << ": " << first_line(e.what());
  }
  return std::make_shared<RunStore>("fanout/" + run_id, base,
                                    std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
}

void forget_keys(const Rendezvous& r, const std::string& run_id, const std::vector<std::string>& keys) {
  if (r.kind == Rendezvous::Kind::File) {
    try {
      OurFileStore store(r.path);
      for (const auto& k : keys) store.forget("fanout/" + run_id + "/" + k);
    } catch (const std::exception&) {  // a folder gone: nothing to forget
    }
    return;
  }
  redisContext* c = redisConnectWithTimeout(r.host.c_str(), r.port, to_timeval(2));
  if (c != nullptr && !c->err) {
    redisSetTimeout(c, to_timeval(2));
    if (authenticate(c, r).empty())
      for (const auto& k : keys) {
        const std::string key = "fanout/" + run_id + "/" + k;
        if (auto* reply = static_cast<redisReply*>(redisCommand(c, "DEL %s", key.c_str()))) freeReplyObject(reply);
      }
  }
  if (c) redisFree(c);
}

std::string interface_address(const std::string& ifname) {
  FANOUT_USER_CHECK(if_nametoindex(ifname.c_str()) != 0)
      << "there is no network interface '" << ifname << "' on this machine (see `ip -brief address`)";
  ifaddrs* list = nullptr;
  FANOUT_CHECK(getifaddrs(&list) == 0) << "getifaddrs: " << std::strerror(errno);
  std::string ip;
  for (ifaddrs* a = list; a && ip.empty(); a = a->ifa_next)
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && ifname == a->ifa_name) {
      char buf[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
      ip = buf;
    }
  freeifaddrs(list);
  FANOUT_USER_CHECK(!ip.empty()) << "network interface '" << ifname << "' has no IPv4 address";
  return ip;
}

void use_interface(const std::string& ifname) {
  interface_address(ifname);
  ::setenv("GLOO_SOCKET_IFNAME", ifname.c_str(), 1);
  ::setenv("NCCL_SOCKET_IFNAME", ifname.c_str(), 1);
}

void read_rdzv_password(const std::string& path) {
  std::error_code ec;
  FANOUT_USER_CHECK(!fs::is_directory(path, ec)) << "--rdzv-password-file " << path << " is a directory, not a file";
  std::ifstream in(path);
  FANOUT_USER_CHECK(in) << "cannot read --rdzv-password-file " << path << ": " << std::strerror(errno);
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  FANOUT_USER_CHECK(!line.empty()) << "--rdzv-password-file " << path << " is empty (its first line is the password)";
  ::setenv("FANOUT_RDZV_PASSWORD", line.c_str(), 1);
  ::setenv("FANOUT_RDZV_PASSWORD_FILE", path.c_str(), 1);  // errors name the file, not the variable
}

std::string route_address(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) return "";
  std::string ip;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  // Connecting a UDP socket sends nothing: it only picks the route and the source address.
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof me;
    char buf[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
        inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf) != nullptr)
      ip = buf;
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return ip;
}

std::vector<std::pair<std::string, std::string>> probe_hosts(const std::vector<std::string>& hosts, double timeout_s) {
  struct Probe {
    std::string host;
    int fd = -1;
    std::string result;  // empty: no answer yet
  };
  std::vector<Probe> probes;
  for (const auto& h : hosts) {
    Probe p;
    p.host = h;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(9);  // discard: any answer, even a refusal, shows the machine is there
    if (inet_pton(AF_INET, h.c_str(), &a.sin_addr) != 1) {
      p.result = "answers";  // not an address we can probe: make no claim about it
    } else {
      p.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      const int rc = p.fd < 0 ? -1 : ::connect(p.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      if (rc == 0 || (rc < 0 && errno == ECONNREFUSED)) p.result = "answers";
      else if (rc < 0 && errno != EINPROGRESS) p.result = std::strerror(errno);
    }
    probes.push_back(std::move(p));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Probe*> open;
    for (auto& p : probes)
      if (p.result.empty()) {
        fds.push_back({p.fd, POLLOUT, 0});
        open.push_back(&p);
      }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (fds.empty() || left.count() <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      open[i]->result = err == 0 || err == ECONNREFUSED ? "answers" : std::strerror(err);
    }
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& p : probes) {
    if (p.fd >= 0) ::close(p.fd);
    out.emplace_back(p.host, p.result.empty() ? "no answer" : p.result);
  }
  return out;
}

}  // namespace fanout::distributed
