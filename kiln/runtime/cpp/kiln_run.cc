// kiln_run: run a Kiln artifact with no Python, on the TVM runtime library alone.
//
//   kiln_run MODEL_DIR -o OUT_DIR IN0.npy [IN1.npy ...]
//
// MODEL_DIR holds the artifact's members (`kiln unpack model.kiln MODEL_DIR`): manifest.json,
// model.so, weights.bin. Before loading any code it checks every member's size and sha256 against
// the manifest and the manifest's architecture against this machine; then it loads model.so into
// TVM's Relax VM, builds the weights from weights.bin, runs `main` on the .npy inputs (in the
// manifest's input order, shapes and dtypes checked) and writes OUT_DIR/<output name>.npy.
// Exit codes: 0 ok, 2 bad input/artifact (message on stderr says what, where and what to do).
#include <dlfcn.h>
#include <dlpack/dlpack.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ffi = tvm::ffi;
using ffi::Tensor;

struct KilnError : std::runtime_error {
  explicit KilnError(const std::string& m) : std::runtime_error(m) {}
};

// 64-byte aligned host memory for tensors (what TVM's kernels assume)
struct CPUAlloc {
  void AllocData(DLTensor* t) { t->data = aligned_alloc(64, (ffi::GetDataSize(*t) + 63) / 64 * 64); }
  void FreeData(DLTensor* t) { free(t->data); }
};

static Tensor host_tensor(const std::vector<int64_t>& shape, DLDataType dtype, const void* src, size_t nbytes) {
  Tensor t = Tensor::FromNDAlloc(CPUAlloc(), ffi::Shape(shape), dtype, DLDevice{kDLCPU, 0});
  if (nbytes != ffi::GetDataSize(*t.GetDLTensorPtr())) throw KilnError("tensor data size does not match its shape and dtype");
  std::memcpy(t.data_ptr(), src, nbytes);
  return t;
}

static std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw KilnError(path + ": cannot read -> check the path (unpack the artifact with `kiln unpack`)");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// ---- SHA-256 (FIPS 180-4) ----
static std::string sha256_hex(const std::string& data) {
  static const uint32_t K[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be,
      0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa,
      0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85,
      0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
      0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f,
      0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string m = data;
  uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  m.push_back(static_cast<char>(0x80));
  while (m.size() % 64 != 56) m.push_back(0);
  for (int i = 7; i >= 0; --i) m.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  for (size_t off = 0; off < m.size(); off += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      const unsigned char* p = reinterpret_cast<const unsigned char*>(m.data() + off + 4 * i);
      w[i] = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
  char out[65];
  for (int i = 0; i < 8; ++i) std::snprintf(out + 8 * i, 9, "%08x", h[i]);
  return std::string(out, 64);
}

// ---- dtypes and .npy ----
struct DType { const char* name; const char* npy; DLDataType dl; };
static const DType kDTypes[] = {
    {"float32", "<f4", {kDLFloat, 32, 1}}, {"float16", "<f2", {kDLFloat, 16, 1}}, {"float64", "<f8", {kDLFloat, 64, 1}},
    {"int8", "|i1", {kDLInt, 8, 1}},       {"uint8", "|u1", {kDLUInt, 8, 1}},     {"int32", "<i4", {kDLInt, 32, 1}},
    {"int64", "<i8", {kDLInt, 64, 1}},     {"bool", "|b1", {kDLBool, 8, 1}},      {"bfloat16", "<V2", {kDLBfloat, 16, 1}}};

static const DType& dtype_named(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d;
  throw KilnError("dtype " + name + " is not supported by kiln_run -> use float32/16/64, (u)int8, int32, int64, bool, bfloat16");
}

struct Npy { std::string descr; std::vector<int64_t> shape; std::string data; };

static Npy read_npy(const std::string& path) {
  std::string raw = read_file(path);
  if (raw.size() < 10 || raw.compare(0, 6, "\x93NUMPY") != 0) throw KilnError(path + ": not a .npy file -> save inputs with numpy.save");
  int major = static_cast<unsigned char>(raw[6]);
  size_t hlen = major == 1 ? (uint8_t(raw[8]) | (uint8_t(raw[9]) << 8)) : (uint8_t(raw[8]) | (uint8_t(raw[9]) << 8) | (uint8_t(raw[10]) << 16) | (uint32_t(uint8_t(raw[11])) << 24));
  size_t start = major == 1 ? 10 : 12;
  std::string header = raw.substr(start, hlen);
  auto field = [&](const std::string& key) {
    size_t p = header.find("'" + key + "'");
    if (p == std::string::npos) throw KilnError(path + ": .npy header has no " + key);
    return header.substr(header.find(':', p) + 1);
  };
  Npy n;
  std::string d = field("descr");
  size_t q1 = d.find('\''), q2 = d.find('\'', q1 + 1);
  n.descr = d.substr(q1 + 1, q2 - q1 - 1);
  if (field("fortran_order").find("True") < field("fortran_order").find(',')) throw KilnError(path + ": Fortran-ordered arrays are not supported -> numpy.ascontiguousarray before saving");
  std::string s = field("shape");
  s = s.substr(s.find('(') + 1, s.find(')') - s.find('(') - 1);
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (item.find_first_not_of(" ") != std::string::npos) n.shape.push_back(std::stoll(item));
  n.data = raw.substr(start + hlen);
  return n;
}

static void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape, const std::string& data) {
  std::string shp = "(";
  for (size_t i = 0; i < shape.size(); ++i) shp += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  shp += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shp + ", }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    uint16_t hl = static_cast<uint16_t>(header.size());
    f.put(char(hl & 0xff));
    f.put(char(hl >> 8));
    f << header;
    f.write(data.data(), data.size());
    if (!f) throw KilnError(path + ": cannot write -> check the output folder");
  }
  std::rename(tmp.c_str(), path.c_str());  // atomic: a reader never sees half a file
}

static std::vector<int64_t> ints(const ffi::Any& v) {
  std::vector<int64_t> out;
  for (const ffi::Any& x : v.cast<ffi::Array<ffi::Any>>()) out.push_back(x.cast<int64_t>());
  return out;
}

static std::string str(const ffi::Map<ffi::Any, ffi::Any>& m, const char* key) { return m.at(ffi::String(key)).cast<ffi::String>(); }

static int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

static std::string host_arch() {
  utsname u;
  uname(&u);
  std::string m = u.machine;
  return m == "arm64" ? "aarch64" : m;
}

// AMX tiles: Linux grants the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+),
// before which the first tile instruction dies with SIGILL; Python's runtime does the same (hostinfo.enable_amx).
static void request_amx_if_used(const ffi::Map<ffi::Any, ffi::Any>& manifest) {
  bool amx = false;
  for (const ffi::Any& f : manifest.at(ffi::String("cpu_features")).cast<ffi::Array<ffi::Any>>())
    amx = amx || std::string(f.cast<ffi::String>()) == "amx-tile";
  if (!amx) return;
#if defined(__x86_64__) && defined(__linux__)
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0) return;
  throw KilnError(std::string("artifact uses AMX tiles and the kernel refused them (") + std::strerror(errno) +
                  ") -> run it on Linux 5.16+, or recompile with -mattr=-amx-tile");
#else
  throw KilnError("artifact uses AMX tiles, which need Linux on x86-64 -> recompile with -mattr=-amx-tile");
#endif
}

// The artifact's parallel loops on Kiln's thread pool (kiln/runtime/pool.c, linked into the library;
// kiln/runtime/pool.py does the same for Python), with as many threads as TVM's pool would use.
// Libraries built before the pool, or with TVM's parallel barrier, keep TVM's; so does
// KILN_THREAD_POOL=tvm.
static void use_kiln_pool(const std::string& so) {
  const char* env = std::getenv("KILN_THREAD_POOL");
  if (env && std::string(env) == "tvm") return;
  void* h = dlopen(so.c_str(), RTLD_NOLOAD | RTLD_LAZY);  // the copy TVM loaded
  if (!h) return;
  void* launch = dlsym(h, "kiln_pool_launch");
  void* configure = dlsym(h, "kiln_pool_configure");
  void** slot = reinterpret_cast<void**>(dlsym(h, "__TVMBackendParallelLaunch"));
  if (launch && configure && slot && !dlsym(h, "__TVMBackendParallelBarrier")) {
    int threads = 0;
    if (auto f = ffi::Function::GetGlobal("runtime.NumThreads")) threads = (*f)().cast<int>();
    if (threads < 1) threads = static_cast<int>(std::thread::hardware_concurrency());
    reinterpret_cast<void (*)(int, long)>(configure)(threads < 1 ? 1 : threads, -1);
    *slot = launch;
  }
  // h stays open: the pool's workers run code of this library until the process ends, and TVM's
  // module closes its own handle at exit (a worker spinning in unmapped code crashed kiln_run)
}

static int run(int argc, char** argv) {
  if (argc < 4) throw KilnError("usage: kiln_run MODEL_DIR -o OUT_DIR IN0.npy [IN1.npy ...]");
  std::string dir = argv[1], out_dir;
  std::vector<std::string> inputs;
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "-o" && i + 1 < argc) out_dir = argv[++i];
    else inputs.push_back(argv[i]);
  }
  if (out_dir.empty()) throw KilnError("no output folder -> pass -o OUT_DIR");
  ffi::String err;
  auto manifest = ffi::json::Parse(ffi::String(read_file(dir + "/manifest.json")), &err).cast<ffi::Map<ffi::Any, ffi::Any>>();
  if (!err.empty()) throw KilnError(dir + "/manifest.json: " + std::string(err) + " -> recompile the model");
  // every member: size and checksum, before any code is loaded
  auto members = manifest.at(ffi::String("members")).cast<ffi::Map<ffi::Any, ffi::Any>>();
  std::map<std::string, std::string> blobs;
  for (const auto& kv : members) {
    std::string name = kv.first.cast<ffi::String>();
    auto info = kv.second.cast<ffi::Map<ffi::Any, ffi::Any>>();
    std::string data = read_file(dir + "/" + name);
    if (int64_t(data.size()) != info.at(ffi::String("size")).cast<int64_t>() || sha256_hex(data) != str(info, "sha256"))
      throw KilnError(dir + "/" + name + ": checksum mismatch (corrupt or tampered) -> unpack the artifact again or recompile");
    blobs[name] = std::move(data);
  }
  std::string arch = str(manifest, "arch");
  if (arch != host_arch()) throw KilnError("artifact is built for " + arch + ", this machine is " + host_arch() + " -> compile with a matching --target");
  request_amx_if_used(manifest);
  if (manifest.count(ffi::String("device")) && str(manifest, "device") != "cpu") throw KilnError("kiln_run runs CPU artifacts only -> compile without --target cuda");
  if (manifest.count(ffi::String("accelerator")) && manifest.at(ffi::String("accelerator")) != nullptr)
    throw KilnError("artifact offloads layers to an accelerator simulator, which needs Python -> use `kiln run`");
  // weights
  std::vector<Tensor> weights;
  const std::string& wblob = blobs.at("weights.bin");
  for (const ffi::Any& w_any : manifest.at(ffi::String("weights")).cast<ffi::Array<ffi::Any>>()) {
    auto w = w_any.cast<ffi::Map<ffi::Any, ffi::Any>>();
    auto shape = ints(w.at(ffi::String("shape")));
    int64_t off = w.at(ffi::String("offset")).cast<int64_t>(), nbytes = w.at(ffi::String("nbytes")).cast<int64_t>();
    if (off + nbytes > int64_t(wblob.size())) throw KilnError("weights.bin is shorter than the manifest says -> recompile the model");
    weights.push_back(host_tensor(shape, dtype_named(str(w, "dtype")).dl, wblob.data() + off, nbytes));
  }
  // inputs, in the manifest's order
  auto specs = manifest.at(ffi::String("inputs")).cast<ffi::Array<ffi::Any>>();
  if (inputs.size() != specs.size()) throw KilnError("the model has " + std::to_string(specs.size()) + " inputs, got " + std::to_string(inputs.size()) + " .npy files -> pass one per input, in order");
  std::vector<ffi::Any> args;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto spec = specs[i].cast<ffi::Map<ffi::Any, ffi::Any>>();
    Npy n = read_npy(inputs[i]);
    const DType& dt = dtype_named(str(spec, "dtype"));
    auto shape = ints(spec.at(ffi::String("shape")));
    if (n.descr != dt.npy || n.shape != shape)
      throw KilnError(inputs[i] + ": input '" + str(spec, "name") + "' needs " + dt.name + " of the manifest's shape -> save it with that dtype and shape");
    if (n.data.size() != size_t(numel(shape)) * (dt.dl.bits / 8)) throw KilnError(inputs[i] + ": truncated .npy data -> save it again");
    args.push_back(host_tensor(shape, dt.dl, n.data.data(), n.data.size()));
  }
  // the first bucket's (model.so's) parameters: indices into the deduplicated weights (identical
  // arrays are stored once); a manifest without them takes every weight in order
  auto buckets = manifest.count(ffi::String("buckets")) ? manifest.at(ffi::String("buckets")).cast<ffi::Array<ffi::Any>>()
                                                        : ffi::Array<ffi::Any>();
  auto bucket0 = buckets.size() ? buckets[0].cast<ffi::Map<ffi::Any, ffi::Any>>() : ffi::Map<ffi::Any, ffi::Any>();
  if (bucket0.count(ffi::String("weights"))) {
    for (int64_t i : ints(bucket0.at(ffi::String("weights")))) {
      if (i < 0 || size_t(i) >= weights.size()) throw KilnError("the manifest's bucket names a weight it does not have -> recompile the model");
      args.push_back(weights[size_t(i)]);
    }
  } else {
    for (auto& w : weights) args.push_back(w);
  }
  // the library: Relax VM on the CPU (pooled allocator, as the Python runtime)
  std::string so = dir + "/" + "model.so";
  ffi::Module lib = ffi::Module::LoadFromFile(so);
  use_kiln_pool(so);
  ffi::Module vm = lib->GetFunction("vm_load_executable").value()().cast<ffi::Module>();
  vm->GetFunction("vm_initialization").value()(int(kDLCPU), 0, 2);
  std::string entry = manifest.count(ffi::String("entry")) ? str(manifest, "entry") : "main";
  ffi::Function main_fn = vm->GetFunction(ffi::String(entry)).value();
  std::vector<ffi::AnyView> views(args.begin(), args.end());
  ffi::Any result;
  main_fn.CallPacked(views.data(), static_cast<int>(views.size()), &result);
  std::vector<Tensor> outs;
  if (auto t = result.as<Tensor>()) outs.push_back(*t);
  else for (const ffi::Any& o : result.cast<ffi::Array<ffi::Any>>()) outs.push_back(o.cast<Tensor>());
  auto ospecs = manifest.at(ffi::String("outputs")).cast<ffi::Array<ffi::Any>>();
  mkdir(out_dir.c_str(), 0755);
  for (size_t i = 0; i < outs.size() && i < ospecs.size(); ++i) {
    auto spec = ospecs[i].cast<ffi::Map<ffi::Any, ffi::Any>>();
    auto shape = ints(spec.at(ffi::String("shape")));
    const DType& dt = dtype_named(str(spec, "dtype"));
    std::string data(static_cast<const char*>(outs[i].data_ptr()) + outs[i].byte_offset(), numel(shape) * (dt.dl.bits / 8));
    write_npy(out_dir + "/" + str(spec, "name") + ".npy", dt.npy, shape, data);
  }
  std::cout << "wrote " << outs.size() << " output(s) to " << out_dir << std::endl;
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const KilnError& e) {
    std::cerr << "kiln_run: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kiln_run: internal error: " << e.what() << std::endl;
    return 1;
  }
}
