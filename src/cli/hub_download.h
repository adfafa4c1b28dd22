// `kettle get ORG/NAME [--revision R]`: a model from the Hugging Face Hub (the
// API at $HF_ENDPOINT, https://huggingface.co by default; $HF_TOKEN for
// private and gated repos) into the standard hub cache layout, so other tools
// see it: blobs/{sha256 or git blob id}, snapshots/{commit}/{file} linking to
// them, refs/{revision}. Transfers go to blobs/{name}.incomplete and resume
// with HTTP ranges (a cut transfer is retried from where it stopped, and a
// later run picks up a file left unfinished); LFS files are checked against
// their SHA-256 (a mismatch is fetched once more, then refused); a disk
// without room for what is missing is refused before anything is fetched.
#pragma once

#include <string>

namespace kettle::cli {

struct HubGetOptions {
  std::string repo;                // "org/name"
  std::string revision = "main";   // a branch, tag or commit
  std::string endpoint;            // empty: $HF_ENDPOINT, else https://huggingface.co
  std::string token;               // empty: $HF_TOKEN
  std::string cache_dir;           // the hub cache (hf_hub_cache_dir())
};

// Downloads what the cache lacks; returns the snapshot folder. Throws kettle::Error naming
// the repo, file or cause (not found, a token needed or refused, no room, a checksum).
std::string hub_get(const HubGetOptions& options);

}  // namespace kettle::cli
