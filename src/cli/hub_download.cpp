#include "cli/hub_download.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "util/digest.h"
#include "util/error.h"
#include "util/log.h"
#include "util/progress.h"

namespace kettle::cli {
namespace fs = std::filesystem;
namespace {

constexpr int kAttempts = 4;  // a cut transfer resumes this many times before the run gives up

struct HubFile {
  std::string name;    // path in the repo
  int64_t size = 0;
  std::string blob;    // the blob's name in the cache: its SHA-256 (LFS) or git blob id
  std::string sha256;  // LFS files only
};

// libcurl, loaded when `get` first needs it (the rest of kettle never does): its functions
// through dlsym, so the binary carries no link to it or its TLS stack.
struct Curl {
  CURLcode (*global_init)(long);
  CURL* (*easy_init)();
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
  CURLcode (*easy_perform)(CURL*);
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
  void (*easy_cleanup)(CURL*);
  const char* (*easy_strerror)(CURLcode);
  curl_slist* (*slist_append)(curl_slist*, const char*);
  void (*slist_free_all)(curl_slist*);
};

const Curl& curl_api() {
  static const Curl api = [] {
    void* lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      fail(ErrorCategory::kUnsupported, "get: libcurl is not installed (Debian: apt-get install libcurl4): {}", dlerror());
    const auto sym = [lib](const char* name) {
      void* f = dlsym(lib, name);
      if (!f) fail(ErrorCategory::kUnsupported, "get: this libcurl lacks {}", name);
      return f;
    };
    Curl c;
    c.global_init = reinterpret_cast<decltype(c.global_init)>(sym("curl_global_init"));
    c.easy_init = reinterpret_cast<decltype(c.easy_init)>(sym("curl_easy_init"));
    c.easy_setopt = reinterpret_cast<decltype(c.easy_setopt)>(sym("curl_easy_setopt"));
    c.easy_perform = reinterpret_cast<decltype(c.easy_perform)>(sym("curl_easy_perform"));
    c.easy_getinfo = reinterpret_cast<decltype(c.easy_getinfo)>(sym("curl_easy_getinfo"));
    c.easy_cleanup = reinterpret_cast<decltype(c.easy_cleanup)>(sym("curl_easy_cleanup"));
    c.easy_strerror = reinterpret_cast<decltype(c.easy_strerror)>(sym("curl_easy_strerror"));
    c.slist_append = reinterpret_cast<decltype(c.slist_append)>(sym("curl_slist_append"));
    c.slist_free_all = reinterpret_cast<decltype(c.slist_free_all)>(sym("curl_slist_free_all"));
    c.global_init(CURL_GLOBAL_DEFAULT);
    return c;
  }();
  return api;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// A path's segments percent-encoded (slashes kept).
std::string encode_path(const std::string& path) {
  std::string out;
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

struct Transfer {
  long status = 0;
  CURLcode code = CURLE_OK;
  std::string error;
};

// One GET: the body to `sink` (false from the sink stops it); `range_from` > 0 asks for the
// rest of a file.
template <typename Sink>
Transfer http_get(const std::string& url, const std::string& token, int64_t range_from, Sink&& sink,
                  const std::function<void(int64_t)>& progress = nullptr) {
  const Curl& api = curl_api();
  CURL* curl = api.easy_init();
  if (!curl) fail(ErrorCategory::kInternal, "get: cannot start an HTTP client");
  struct State {
    Sink* sink;
    const std::function<void(int64_t)>* progress;
    int64_t received = 0;
    long status = 0;
    CURL* curl;
  } state{&sink, &progress, 0, 0, curl};
  curl_slist* headers = nullptr;
  if (!token.empty()) headers = api.slist_append(headers, ("Authorization: Bearer " + token).c_str());
  if (range_from > 0) headers = api.slist_append(headers, fmt::format("Range: bytes={}-", range_from).c_str());
  headers = api.slist_append(headers, "User-Agent: kettle");
  char error[CURL_ERROR_SIZE] = {};
  api.easy_setopt(curl, CURLOPT_URL, url.c_str());
  api.easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  api.easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);  // LFS files redirect to a CDN (without the token)
  api.easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
  api.easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  api.easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
  api.easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);  // a transfer that stalls for a minute is cut (and resumed)
  api.easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
  api.easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  api.easy_setopt(curl, CURLOPT_WRITEDATA, &state);
  api.easy_setopt(curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t, size_t n, void* user) -> size_t {
    auto* s = static_cast<State*>(user);
    if (s->status == 0) curl_api().easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status >= 300) return n;  // an error page: read, not stored
    if (!(*s->sink)(data, n, s->status)) return 0;
    s->received += static_cast<int64_t>(n);
    if (*s->progress) (*s->progress)(s->received);
    return n;
  });
  Transfer t;
  t.code = api.easy_perform(curl);
  api.easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &t.status);
  if (t.code != CURLE_OK) t.error = error[0] ? error : api.easy_strerror(t.code);
  api.slist_free_all(headers);
  api.easy_cleanup(curl);
  return t;
}

[[noreturn]] void refuse_status(long status, const std::string& what, const std::string& repo, bool has_token) {
  if (status == 401 || status == 403)
    fail(ErrorCategory::kInvalidArgument, "get: {}: the Hub answered {} — {}", what, status,
         has_token ? "HF_TOKEN was refused (or lacks access to this repo)"
                   : "the repo is private or gated: set HF_TOKEN to a token with access");
  if (status == 404) fail(ErrorCategory::kNotFound, "get: {}: not found on the Hub ({})", what, repo);
  fail(ErrorCategory::kInternal, "get: {}: the Hub answered HTTP {}", what, status);
}

std::vector<HubFile> list_files(const nlohmann::json& info) {
  std::vector<HubFile> files;
  for (const auto& s : info.value("siblings", nlohmann::json::array())) {
    HubFile f;
    f.name = s.value("rfilename", "");
    f.size = s.value("size", int64_t{-1});
    if (s.contains("lfs") && s["lfs"].is_object()) {
      f.sha256 = s["lfs"].value("sha256", "");
      f.size = s["lfs"].value("size", f.size);
      f.blob = f.sha256;
    } else {
      f.blob = s.value("blobId", "");
    }
    if (f.name.empty() || f.blob.empty() || f.name.find("..") != std::string::npos || f.name.front() == '/' ||
        f.blob.find('/') != std::string::npos)
      fail(ErrorCategory::kInvalidData, "get: the Hub's file list has an entry kettle cannot place: {}", s.dump());
    files.push_back(std::move(f));
  }
  return files;
}

int64_t file_size_or(const fs::path& p, int64_t fallback) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? fallback : static_cast<int64_t>(n);
}

std::string file_sha256(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  const Sha256Digest d = h.finish();
  return hex(d);
}

// One file into blobs/{blob}: resumed from its .incomplete, retried when cut, checked.
void fetch_blob(const HubGetOptions& o, const std::string& endpoint, const std::string& commit, const HubFile& f,
                const fs::path& blobs, ProgressBar& bar, int64_t& done_bytes) {
  const fs::path target = blobs / f.blob, partial = blobs / (f.blob + ".incomplete");
  const std::string url = fmt::format("{}/{}/resolve/{}/{}", endpoint, o.repo, commit, encode_path(f.name));
  bool refetched = false;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    int64_t have = file_size_or(partial, 0);
    if (f.size >= 0 && have > f.size) have = 0;  // longer than the file: start over
    std::FILE* out = std::fopen(partial.c_str(), have > 0 ? "ab" : "wb");
    if (!out) fail(ErrorCategory::kInvalidArgument, "get: cannot write {}", partial.string());
    const int64_t base = done_bytes;
    bool first = true;
    const Transfer t = http_get(
        url, o.token, have,
        [&](const char* data, size_t n, long status) {
          if (first && status == 200 && have > 0) {  // the server ignored the range: the whole file comes
            std::fflush(out);
            if (ftruncate(fileno(out), 0) != 0) return false;
            have = 0;
          }
          first = false;
          return std::fwrite(data, 1, n, out) == n;
        },
        [&](int64_t received) { bar.update(base + have + received, f.name); });
    std::fclose(out);
    if (t.status >= 300 && t.status != 416) refuse_status(t.status, f.name, o.repo, !o.token.empty());
    const int64_t now = file_size_or(partial, 0);
    if (t.code != CURLE_OK || (f.size >= 0 && now < f.size)) {
      log::warn("get: {} stopped at {} of {} bytes ({}); resuming", f.name, now, f.size,
                t.error.empty() ? "cut short" : t.error);
      continue;
    }
    if (!f.sha256.empty()) {
      const std::string got = file_sha256(partial);
      if (got != f.sha256) {
        fs::remove(partial);
        if (refetched)
          fail(ErrorCategory::kInvalidData, "get: {} has SHA-256 {} twice, the Hub says {}; not kept", f.name, got,
               f.sha256);
        log::warn("get: {} has SHA-256 {}, the Hub says {}; fetching it again", f.name, got, f.sha256);
        refetched = true;
        continue;
      }
    }
    fs::rename(partial, target);
    done_bytes += now;
    bar.update(done_bytes, f.name);
    return;
  }
  fail(ErrorCategory::kInternal, "get: {}: the transfer was cut {} times; run kettle get again to resume it", f.name,
       kAttempts);
}

}  // namespace

std::string hub_get(const HubGetOptions& opts) {
  HubGetOptions o = opts;
  const std::string endpoint = [&] {
    std::string e = o.endpoint.empty() ? env_or("HF_ENDPOINT", "https://huggingface.co") : o.endpoint;
    while (!e.empty() && e.back() == '/') e.pop_back();
    return e;
  }();
  if (o.token.empty()) o.token = env_or("HF_TOKEN", "");
  const size_t slash = o.repo.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == o.repo.size() || o.repo.find('/', slash + 1) != std::string::npos ||
      o.repo.find("..") != std::string::npos)
    fail(ErrorCategory::kInvalidArgument, "get: '{}' is not a repo id (ORG/NAME)", o.repo);

  // The revision's commit and files.
  std::string body;
  const std::string api = fmt::format("{}/api/models/{}/revision/{}?blobs=true", endpoint, o.repo, encode_path(o.revision));
  const Transfer t = http_get(api, o.token, 0, [&](const char* d, size_t n, long) {
    if (body.size() + n > (size_t{64} << 20)) return false;
    body.append(d, n);
    return true;
  });
  if (t.code != CURLE_OK && t.status == 0) fail(ErrorCategory::kNotFound, "get: cannot reach {} ({})", endpoint, t.error);
  if (t.status != 200) refuse_status(t.status, fmt::format("{} at revision {}", o.repo, o.revision), o.repo, !o.token.empty());
  const nlohmann::json info = nlohmann::json::parse(body, nullptr, false);
  if (info.is_discarded() || !info.contains("sha") || !info["sha"].is_string())
    fail(ErrorCategory::kInvalidData, "get: {} answered something that is not the Hub's model info", api);
  const std::string commit = info["sha"];
  if (commit.empty() || commit.find('/') != std::string::npos || commit.find("..") != std::string::npos)
    fail(ErrorCategory::kInvalidData, "get: the Hub named commit '{}'", commit);
  const std::vector<HubFile> files = list_files(info);

  const fs::path repo_dir = fs::path(o.cache_dir) / ("models--" + o.repo.substr(0, slash) + "--" + o.repo.substr(slash + 1));
  const fs::path blobs = repo_dir / "blobs", snapshot = repo_dir / "snapshots" / commit;
  fs::create_directories(blobs);
  fs::create_directories(snapshot);

  // Room for what is missing, before anything is fetched.
  int64_t missing = 0, total = 0;
  for (const HubFile& f : files) {
    total += std::max<int64_t>(f.size, 0);
    if (!fs::exists(blobs / f.blob)) missing += std::max<int64_t>(0, f.size - file_size_or(blobs / (f.blob + ".incomplete"), 0));
  }
  struct statvfs vfs {};
  if (statvfs(blobs.c_str(), &vfs) == 0) {
    const int64_t room = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
    if (missing > room)
      fail(ErrorCategory::kResourceExhausted, "get: {} needs {:.1f} MB more, and {} has {:.1f} MB free", o.repo,
           static_cast<double>(missing) / 1e6, o.cache_dir, static_cast<double>(room) / 1e6);
  }

  ProgressBar bar(fmt::format("get {}", o.repo), total);
  int64_t done = 0;
  for (const HubFile& f : files) {
    if (fs::exists(blobs / f.blob) && (f.size < 0 || file_size_or(blobs / f.blob, -1) == f.size)) {
      done += std::max<int64_t>(f.size, 0);
    } else {
      fetch_blob(o, endpoint, commit, f, blobs, bar, done);
    }
    // snapshots/{commit}/{name} → ../../blobs/{blob}, one more ../ per folder in the name.
    const fs::path link = snapshot / f.name;
    fs::create_directories(link.parent_path());
    std::string up = "../../";
    for (char c : f.name)
      if (c == '/') up += "../";
    std::error_code ec;
    fs::remove(link, ec);
    fs::create_symlink(up + "blobs/" + f.blob, link);
  }
  bar.finish();
  if (o.revision != commit) {
    fs::create_directories((repo_dir / "refs" / o.revision).parent_path());
    std::ofstream(repo_dir / "refs" / o.revision) << commit;
  }
  return snapshot.string();
}

}  // namespace kettle::cli
