// TRTEngineOp for tftrt_py: a TensorFlow op whose kernel hands its inputs to
// Python (tftrt_py.engine_op.dispatcher) and, when no engine serves them, runs
// the native segment function instead. Also TF-TRT's Grappler pass
// "TensorRTOptimizer" (online conversion in TF1 sessions; see the end).
//
// Python protocol (functions looked up by name on every call):
//   dispatcher.create(node_def: bytes, function_def: bytes, callees: bytes) -> int
//     callees: a FunctionDefLibrary of the functions function_def reaches
//   dispatcher.run(handle: int, inputs: list[(dtype name, shape, memoryview)],
//                  assets: list[bytes], allocate) -> list of buffers | None
//     where allocate(index, shape) -> writable memoryview allocates an output
//     tensor; outputs returned in the buffers it gave are not copied again
//   dispatcher.replay(handle: int, inputs) -> (list[int], keep) | None | False
//     after a run the engine served: a native replay for those input shapes
//     (tftrt_py/engine/replay.py; layout in ParseReplay), which this kernel
//     then runs without Python while keeping a reference to `keep`; None:
//     not now (asked again after kReplayRetry Python runs); False: never
//   dispatcher.release(handle: int)
//   dispatcher.warn(message: str): the kernel's warnings, through Python's
//     logging
//
// GIL rules: TF calls kernels without the GIL (the Python caller released it),
// so every Python call takes it with PyGILState_Ensure. It is never held while
// waiting on TensorFlow: it is released before the native segment runs and
// before done() is called.

#include <Python.h>  // first, as Python asks

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow/core/protobuf/rewriter_config.pb.h"

namespace tftrt_py {
namespace {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::DataType;
using ::tensorflow::DataTypeVector;
using ::tensorflow::FunctionLibraryRuntime;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

constexpr char kDispatcherModule[] = "tftrt_py.engine_op.dispatcher";
constexpr char kOnlineModule[] = "tftrt_py.converters.online";

bool PythonUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// ---------------------------------------------------------------------------
// Python helpers. All of them need the GIL held by the caller.

// Gives a thread Python has never seen (TF's inter-op threads) a Python thread
// state that lasts as long as the thread: without it every PyGILState_Ensure
// makes a fresh one and PyGILState_Release destroys it, and the thread-local
// data Python code keeps (threading.local: cupy's current device and stream,
// among others) is rebuilt on every kernel call.
void KeepThreadState() {
  static thread_local bool kept = false;
  if (kept) return;
  kept = true;
  if (PyGILState_GetThisThreadState() != nullptr) return;  // a Python thread
  PyGILState_Ensure();  // creates the thread state, takes the GIL
  PyEval_SaveThread();  // gives the GIL back; the thread state stays
}

// Holds the GIL for its scope (reentrant: fine on a thread that has it).
class Gil {
 public:
  Gil() : state_((KeepThreadState(), PyGILState_Ensure())) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

// Owned reference; Py_XDECREF on scope exit (GIL must still be held then).
struct PyDecRef {
  void operator()(PyObject* o) const { Py_XDECREF(o); }
};
using PyRef = std::unique_ptr<PyObject, PyDecRef>;

std::string PyStr(PyObject* o) {
  if (o == nullptr) return "";
  PyRef s(PyObject_Str(o));
  if (!s) {
    PyErr_Clear();
    return "<unprintable>";
  }
  const char* utf8 = PyUnicode_AsUTF8(s.get());
  if (utf8 == nullptr) {
    PyErr_Clear();
    return "<unprintable>";
  }
  return utf8;
}

// The TF status code an exception names in its int `error_code` attribute
// (as tf.errors.OpError and engine_op.op.NativeFallbackForbidden do), or OK.
absl::StatusCode DeclaredCode(PyObject* value) {
  PyRef code(PyObject_GetAttrString(value, "error_code"));
  if (!code || !PyLong_Check(code.get())) {
    PyErr_Clear();
    return absl::StatusCode::kOk;
  }
  const long c = PyLong_AsLong(code.get());
  if (c <= 0 || c > static_cast<long>(absl::StatusCode::kUnauthenticated)) {
    PyErr_Clear();
    return absl::StatusCode::kOk;
  }
  return static_cast<absl::StatusCode>(c);
}

// Turns the pending Python exception into a Status (clearing it): the code
// the exception declares (error_code), else ValueError/TypeError ->
// InvalidArgument, anything else -> Internal.
absl::Status StatusFromPyErr(const std::string& prefix) {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  if (type == nullptr) return errors::Internal(prefix, "unknown Python error");
  PyErr_NormalizeException(&type, &value, &tb);
  PyRef t(type), v(value), b(tb);
  std::string name = reinterpret_cast<PyTypeObject*>(type)->tp_name;
  std::string msg = absl::StrCat(prefix, name, ": ", PyStr(value));
  const absl::StatusCode declared = DeclaredCode(value);
  if (declared != absl::StatusCode::kOk) return absl::Status(declared, msg);
  if (PyErr_GivenExceptionMatches(type, PyExc_ValueError) ||
      PyErr_GivenExceptionMatches(type, PyExc_TypeError)) {
    return errors::InvalidArgument(msg);
  }
  return errors::Internal(msg);
}

// <module>.<name>(args...), imported and looked up at each call so tests
// (and a reloaded module) take effect. Returns a new reference or nullptr
// with a Python exception set.
template <typename... Args>
PyObject* CallPython(const char* module_name, const char* name, Args... args) {
  PyRef module(PyImport_ImportModule(module_name));
  if (!module) return nullptr;
  PyRef fn(PyObject_GetAttrString(module.get(), name));
  if (!fn) return nullptr;
  return PyObject_CallFunctionObjArgs(fn.get(), args..., nullptr);
}

template <typename... Args>
PyObject* CallDispatcher(const char* name, Args... args) {
  return CallPython(kDispatcherModule, name, args...);
}

// dispatcher.warn(message); errors are dropped. GIL held.
void Warn(const std::string& message) {
  PyRef text(PyUnicode_DecodeUTF8(message.data(), message.size(), "replace"));
  PyRef result(text ? CallDispatcher("warn", text.get()) : nullptr);
  if (!result) PyErr_Clear();
}

// A Python object that owns a reference to a Tensor's buffer and exports it
// through the buffer protocol (read-only for inputs, writable for outputs).
// The memoryviews handed to run() are made from it, so they stay valid however
// long Python keeps them (a bare PyMemoryView_FromMemory would dangle once the
// kernel call ends). Zero copy.
struct TensorHolder {
  PyObject_HEAD
  Tensor* tensor;  // a copy sharing the buffer (refcounted), deleted in dealloc
  int readonly;
};

int TensorHolderGetBuffer(PyObject* self, Py_buffer* view, int flags) {
  static char empty = 0;
  auto* holder = reinterpret_cast<TensorHolder*>(self);
  auto data = holder->tensor->tensor_data();
  void* ptr = data.empty() ? &empty : const_cast<char*>(data.data());
  return PyBuffer_FillInfo(view, self, ptr, data.size(), holder->readonly, flags);
}

void TensorHolderDealloc(PyObject* self) {
  delete reinterpret_cast<TensorHolder*>(self)->tensor;
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject* TensorHolderType() {
  // Initialised once, on first use (under the GIL; C++ statics are also
  // thread-safe). Never freed: types live as long as the interpreter.
  static PyBufferProcs procs = {TensorHolderGetBuffer, nullptr};
  static PyTypeObject* type = []() -> PyTypeObject* {
    static PyTypeObject t = {PyVarObject_HEAD_INIT(nullptr, 0)};
    t.tp_name = "tftrt_py.engine_op.TensorBuffer";
    t.tp_basicsize = sizeof(TensorHolder);
    t.tp_flags = Py_TPFLAGS_DEFAULT;
    t.tp_doc = "A TensorFlow tensor's buffer.";
    t.tp_dealloc = TensorHolderDealloc;
    t.tp_as_buffer = &procs;
    return PyType_Ready(&t) == 0 ? &t : nullptr;
  }();
  if (type == nullptr && !PyErr_Occurred()) {
    PyErr_SetString(PyExc_RuntimeError, "TensorBuffer type is unusable");
  }
  return type;
}

// A memoryview over `t`'s bytes (format 'B', 1-D), new reference.
PyObject* TensorView(const Tensor& t, bool writable) {
  PyTypeObject* type = TensorHolderType();
  if (type == nullptr) return nullptr;
  auto* holder = PyObject_New(TensorHolder, type);
  if (holder == nullptr) return nullptr;
  holder->tensor = new Tensor(t);
  holder->readonly = writable ? 0 : 1;
  PyRef owner(reinterpret_cast<PyObject*>(holder));
  return PyMemoryView_FromObject(owner.get());  // keeps `owner` alive
}

// run()'s `allocate(index, shape) -> memoryview`: allocates output `index` of
// the running kernel (TF's own output tensor) and returns a writable view of
// it, so the engine writes its results in place and nothing is copied back.
// Usable only during that run() call; afterwards it raises RuntimeError.
struct OutputAllocator {
  PyObject_HEAD
  OpKernelContext* ctx;           // null once run() has returned
  std::vector<const char*>* data;  // per output: the allocated buffer, or null
};

PyObject* OutputAllocatorCall(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* a = reinterpret_cast<OutputAllocator*>(self);
  int index = 0;
  PyObject* dims = nullptr;
  if (kwargs != nullptr && PyDict_Size(kwargs) > 0) {
    PyErr_SetString(PyExc_TypeError, "allocate(index, shape) takes no keywords");
    return nullptr;
  }
  if (!PyArg_ParseTuple(args, "iO", &index, &dims)) return nullptr;
  if (a->ctx == nullptr) {
    PyErr_SetString(PyExc_RuntimeError,
                    "allocate() is usable only while the kernel's run() call lasts");
    return nullptr;
  }
  if (index < 0 || index >= static_cast<int>(a->data->size())) {
    PyErr_Format(PyExc_IndexError, "output %d of %d", index,
                 static_cast<int>(a->data->size()));
    return nullptr;
  }
  PyRef seq(PySequence_Fast(dims, "shape must be a sequence of ints"));
  if (!seq) return nullptr;
  TensorShape shape;
  for (Py_ssize_t d = 0; d < PySequence_Fast_GET_SIZE(seq.get()); ++d) {
    const long long n = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq.get(), d));
    if (n == -1 && PyErr_Occurred()) return nullptr;
    const absl::Status s = shape.AddDimWithStatus(n);
    if (!s.ok()) {
      PyErr_SetString(PyExc_ValueError, std::string(s.message()).c_str());
      return nullptr;
    }
  }
  Tensor* out = nullptr;
  const absl::Status s = a->ctx->allocate_output(index, shape, &out);
  if (!s.ok()) {
    PyErr_SetString(PyExc_RuntimeError, std::string(s.message()).c_str());
    return nullptr;
  }
  (*a->data)[index] = out->tensor_data().data();
  return TensorView(*out, /*writable=*/true);
}

PyTypeObject* OutputAllocatorType() {
  static PyTypeObject* type = []() -> PyTypeObject* {
    static PyTypeObject t = {PyVarObject_HEAD_INIT(nullptr, 0)};
    t.tp_name = "tftrt_py.engine_op.OutputAllocator";
    t.tp_basicsize = sizeof(OutputAllocator);
    t.tp_flags = Py_TPFLAGS_DEFAULT;
    t.tp_doc = "allocate(index, shape): a writable view of the kernel's output.";
    t.tp_call = OutputAllocatorCall;
    return PyType_Ready(&t) == 0 ? &t : nullptr;
  }();
  if (type == nullptr && !PyErr_Occurred()) {
    PyErr_SetString(PyExc_RuntimeError, "OutputAllocator type is unusable");
  }
  return type;
}

// ---------------------------------------------------------------------------
// dtype helpers.

const char* NumpyName(DataType dt) {
  switch (dt) {
    case tensorflow::DT_FLOAT: return "float32";
    case tensorflow::DT_HALF: return "float16";
    case tensorflow::DT_INT32: return "int32";
    case tensorflow::DT_INT64: return "int64";
    case tensorflow::DT_INT8: return "int8";
    case tensorflow::DT_BOOL: return "bool";
    default: return nullptr;
  }
}

// A struct-module format char's family: 'f' float, 'i' signed, 'u' unsigned,
// 'b' bool, 0 other.
char FormatFamily(char c) {
  if (std::strchr("efd", c)) return 'f';
  if (std::strchr("bhilqn", c)) return 'i';
  if (std::strchr("BHILQN", c)) return 'u';
  if (c == '?') return 'b';
  return 0;
}

std::string BufferDtypeName(const Py_buffer& b, const std::string& fmt) {
  if (fmt.size() == 1) {
    const std::string bits = std::to_string(8 * b.itemsize);
    switch (FormatFamily(fmt[0])) {
      case 'f': return "float" + bits;
      case 'i': return "int" + bits;
      case 'u': return "uint" + bits;
      case 'b': return "bool";
    }
  }
  return absl::StrCat("buffer format '", fmt, "' (itemsize ", b.itemsize, ")");
}

// Whether buffer `b` holds native-order elements of type `dt`.
bool BufferMatches(const Py_buffer& b, const std::string& fmt, DataType dt) {
  if (fmt.size() != 1) return false;
  const char family = FormatFamily(fmt[0]);
  switch (dt) {
    case tensorflow::DT_FLOAT: return fmt[0] == 'f' && b.itemsize == 4;
    case tensorflow::DT_HALF: return fmt[0] == 'e' && b.itemsize == 2;
    case tensorflow::DT_INT32: return family == 'i' && b.itemsize == 4;
    case tensorflow::DT_INT64: return family == 'i' && b.itemsize == 8;
    case tensorflow::DT_INT8: return family == 'i' && b.itemsize == 1;
    case tensorflow::DT_BOOL: return family == 'b' && b.itemsize == 1;
    default: return false;
  }
}

// The element format of a buffer without its native byte-order prefix;
// "!"/">" (non-native on the little-endian hosts TF runs on) stay in it and
// so never match.
std::string NativeFormat(const Py_buffer& b) {
  std::string fmt = b.format ? b.format : "B";
  if (!fmt.empty() && (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<')) {
    fmt.erase(0, 1);
  }
  return fmt;
}

// ---------------------------------------------------------------------------
// Native replays (tftrt_py/engine/replay.py): an engine captured as one CUDA
// graph at fixed input shapes, run by the kernel without Python: inputs into
// pinned memory and on to the device, the graph, outputs back, synchronize.
// The addresses (CUDA driver calls, context, stream, graph, buffers) come from
// the engine's backend; `keep` owns what they point into.

constexpr uint64_t kReplayVersion = 2;
constexpr size_t kChunkBytes = 1 << 20;   // larger buffers: copied in chunks, in parallel
constexpr int kReplayRetry = 64;          // Python runs before asking again
constexpr uint64_t kMaxRank = 16;
constexpr size_t kPinnedBlocks = 4;       // per replay output: outputs TF holds at once in pinned memory

// Page-locked blocks of one size for a replay output: each run copies the
// output from the device straight into a block, which becomes TensorFlow's
// output tensor (PinnedTensorBuffer) and comes back here when TF drops it, so
// the output crosses to the host once. At most kPinnedBlocks exist; while TF
// holds them all, runs copy through the replay's own pinned buffer instead.
// Blocks are freed when the pool goes: after the replay and every tensor over
// its blocks; not at process exit, where the driver calls may be Python's
// (the tests' fakes) or the driver already shut down.
class PinnedPool {
 public:
  using HostAlloc = int (*)(void**, size_t, unsigned int);
  using HostFree = int (*)(void*);
  PinnedPool(size_t nbytes, HostAlloc alloc, HostFree free, int (*set_context)(void*), void* context)
      : nbytes_(nbytes), alloc_(alloc), free_(free), set_context_(set_context), context_(context) {}
  ~PinnedPool() {
    if (idle_.empty() || !PythonUsable() || set_context_(context_) != 0) return;
    for (char* b : idle_) free_(b);
  }
  size_t nbytes() const { return nbytes_; }

  // An idle block, or a new one; null when kPinnedBlocks are out or
  // allocation fails. The caller has the replay's context current. The
  // allocation runs outside the lock: a thread dropping a tensor (holding
  // the GIL, say) must not wait on it in Release.
  char* Acquire() {
    {
      tensorflow::mutex_lock lock(mu_);
      if (!idle_.empty()) {
        char* b = idle_.back();
        idle_.pop_back();
        return b;
      }
      if (blocks_ >= kPinnedBlocks) return nullptr;
      ++blocks_;  // reserved
    }
    void* b = nullptr;
    if (alloc_(&b, std::max<size_t>(nbytes_, 1), 0) != 0 || b == nullptr) {
      tensorflow::mutex_lock lock(mu_);
      --blocks_;
      return nullptr;
    }
    return static_cast<char*>(b);
  }
  void Release(char* block) {
    tensorflow::mutex_lock lock(mu_);
    idle_.push_back(block);
  }

 private:
  const size_t nbytes_;
  const HostAlloc alloc_;
  const HostFree free_;
  int (*const set_context_)(void*);
  void* const context_;
  tensorflow::mutex mu_;
  std::vector<char*> idle_ TF_GUARDED_BY(mu_);
  size_t blocks_ TF_GUARDED_BY(mu_) = 0;
};

// A TensorFlow tensor's memory that is a PinnedPool block, returned to the
// pool when the last tensor over it goes.
class PinnedTensorBuffer : public tensorflow::TensorBuffer {
 public:
  PinnedTensorBuffer(std::shared_ptr<PinnedPool> pool, char* block)
      : TensorBuffer(block), pool_(std::move(pool)) {}
  ~PinnedTensorBuffer() override { pool_->Release(static_cast<char*>(data())); }
  size_t size() const override { return pool_->nbytes(); }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size()));
    proto->set_allocated_bytes(static_cast<int64_t>(size()));
    proto->set_allocator_name("tftrt_py_pinned");
  }

 private:
  std::shared_ptr<PinnedPool> pool_;
};

struct Replay {
  struct Buffer {
    size_t nbytes = 0;
    char* pinned = nullptr;
    uint64_t device = 0;
    TensorShape shape;                  // outputs
    std::shared_ptr<PinnedPool> blocks;  // outputs: where each run's output lands
  };
  std::string key;  // the input dtypes and shapes it serves (ReplayKey)
  int (*set_context)(void*) = nullptr;
  int (*to_device)(uint64_t, const void*, size_t, void*) = nullptr;
  int (*to_host)(void*, uint64_t, size_t, void*) = nullptr;
  int (*launch)(void*, void*) = nullptr;
  int (*synchronize)(void*) = nullptr;
  PinnedPool::HostAlloc host_alloc = nullptr;
  PinnedPool::HostFree host_free = nullptr;
  void* context = nullptr;
  void* stream = nullptr;
  void* graph = nullptr;
  // [enabled, runs, ns copying in, ns on the device, ns copying out, ns in
  // the kernel, outputs handed to TF in pinned blocks, outputs copied]:
  // Python's (engine/replay.py's state), owned through keep
  int64_t* state = nullptr;
  uint64_t limit = 1;        // replays the kernel may hold for `key`
  std::vector<Buffer> inputs, outputs;
  PyObject* keep = nullptr;  // owned reference, released under the GIL
  bool busy = false;         // guarded by the kernel's replay_mu_
  bool failed = false;       // a CUDA call failed: never run again

  bool usable() const {
    return !failed && __atomic_load_n(&state[0], __ATOMIC_ACQUIRE) != 0;
  }
  void Add(int slot, int64_t value) { __atomic_fetch_add(&state[slot], value, __ATOMIC_RELAXED); }
};

int64_t Nanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Reads the ints of a packed replay in order. GIL held.
class PackedReader {
 public:
  explicit PackedReader(PyObject* seq) : seq_(seq), n_(PySequence_Fast_GET_SIZE(seq)) {}
  bool Next(uint64_t* out) {
    if (i_ >= n_) {
      PyErr_SetString(PyExc_ValueError, "the packed replay is too short");
      return false;
    }
    *out = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq_, i_++));
    return !(*out == static_cast<uint64_t>(-1) && PyErr_Occurred());
  }
  template <typename T>
  bool NextAddress(T* out) {
    uint64_t v = 0;
    if (!Next(&v)) return false;
    if (v == 0) {
      PyErr_SetString(PyExc_ValueError, "the packed replay holds a null address");
      return false;
    }
    *out = reinterpret_cast<T>(static_cast<uintptr_t>(v));
    return true;
  }
  bool AtEnd() const { return i_ == n_; }

 private:
  PyObject* seq_;
  Py_ssize_t n_;
  Py_ssize_t i_ = 0;
};

// A replay from dispatcher.replay's packed list, checked against the inputs
// of `ctx` its engine binds (`engine_inputs`: their byte sizes) and the op's
// output dtypes; null with a Python exception set when it does not fit. GIL
// held.
std::unique_ptr<Replay> ParseReplay(PyObject* packed, OpKernelContext* ctx,
                                    const std::vector<int>& engine_inputs,
                                    const DataTypeVector& out_types) {
  const int n_in = static_cast<int>(engine_inputs.size());
  PyRef seq(PySequence_Fast(packed, "the packed replay must be a list of ints"));
  if (!seq) return nullptr;
  PackedReader r(seq.get());
  auto replay = std::make_unique<Replay>();
  uint64_t version = 0, n = 0;
  if (!r.Next(&version)) return nullptr;
  if (version != kReplayVersion) {
    PyErr_Format(PyExc_ValueError, "packed replay version %llu, expected %llu",
                 static_cast<unsigned long long>(version),
                 static_cast<unsigned long long>(kReplayVersion));
    return nullptr;
  }
  if (!r.NextAddress(&replay->set_context) || !r.NextAddress(&replay->to_device) ||
      !r.NextAddress(&replay->to_host) || !r.NextAddress(&replay->launch) ||
      !r.NextAddress(&replay->synchronize) || !r.NextAddress(&replay->host_alloc) ||
      !r.NextAddress(&replay->host_free) || !r.NextAddress(&replay->context) ||
      !r.NextAddress(&replay->stream) || !r.NextAddress(&replay->graph) ||
      !r.NextAddress(&replay->state) || !r.Next(&replay->limit) || !r.Next(&n)) {
    return nullptr;
  }
  if (n != static_cast<uint64_t>(n_in)) {
    PyErr_Format(PyExc_ValueError, "the replay has %llu inputs, the op %d",
                 static_cast<unsigned long long>(n), n_in);
    return nullptr;
  }
  for (int i = 0; i < n_in; ++i) {
    Replay::Buffer b;
    uint64_t nbytes = 0;
    if (!r.Next(&nbytes) || !r.NextAddress(&b.pinned) || !r.NextAddress(&b.device)) {
      return nullptr;
    }
    b.nbytes = nbytes;
    const Tensor& input = ctx->input(engine_inputs[i]);
    if (nbytes != input.tensor_data().size()) {
      PyErr_Format(PyExc_ValueError, "replay input %d holds %llu bytes, the tensor %zu",
                   i, static_cast<unsigned long long>(nbytes),
                   input.tensor_data().size());
      return nullptr;
    }
    replay->inputs.push_back(b);
  }
  if (!r.Next(&n)) return nullptr;
  if (n != out_types.size()) {
    PyErr_Format(PyExc_ValueError, "the replay has %llu outputs, the op %zu",
                 static_cast<unsigned long long>(n), out_types.size());
    return nullptr;
  }
  for (size_t i = 0; i < out_types.size(); ++i) {
    Replay::Buffer b;
    uint64_t nbytes = 0, rank = 0;
    if (!r.Next(&nbytes) || !r.NextAddress(&b.pinned) || !r.NextAddress(&b.device) ||
        !r.Next(&rank)) {
      return nullptr;
    }
    if (rank > kMaxRank) {
      PyErr_Format(PyExc_ValueError, "replay output %zu has rank %llu", i,
                   static_cast<unsigned long long>(rank));
      return nullptr;
    }
    for (uint64_t d = 0; d < rank; ++d) {
      uint64_t dim = 0;
      if (!r.Next(&dim)) return nullptr;
      const absl::Status s = b.shape.AddDimWithStatus(static_cast<int64_t>(dim));
      if (!s.ok()) {
        PyErr_SetString(PyExc_ValueError, std::string(s.message()).c_str());
        return nullptr;
      }
    }
    b.nbytes = nbytes;
    if (nbytes != static_cast<uint64_t>(b.shape.num_elements()) *
                      tensorflow::DataTypeSize(out_types[i])) {
      PyErr_Format(PyExc_ValueError, "replay output %zu: %llu bytes for shape %s", i,
                   static_cast<unsigned long long>(nbytes), b.shape.DebugString().c_str());
      return nullptr;
    }
    b.blocks = std::make_shared<PinnedPool>(b.nbytes, replay->host_alloc, replay->host_free,
                                            replay->set_context, replay->context);
    replay->outputs.push_back(b);
  }
  if (!r.AtEnd()) {
    PyErr_SetString(PyExc_ValueError, "the packed replay is too long");
    return nullptr;
  }
  return replay;
}

}  // namespace

// ---------------------------------------------------------------------------

class TRTEngineOp : public AsyncOpKernel {
 public:
  explicit TRTEngineOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("segment_func", &func_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("InT", &in_types_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("OutT", &out_types_));
    // Weight inputs (variable values the engines took as weights when built)
    // are no engine bindings: replays skip them.
    std::vector<int> weights;
    if (tensorflow::HasNodeAttr(def(), "_tftrt_weight_inputs")) {
      OP_REQUIRES_OK(ctx, tensorflow::GetNodeAttr(def(), "_tftrt_weight_inputs", &weights));
    }
    for (int i = 0; i < static_cast<int>(in_types_.size()); ++i) {
      if (std::find(weights.begin(), weights.end(), i) == weights.end()) {
        engine_inputs_.push_back(i);
      }
    }
    OP_REQUIRES(ctx, PythonUsable(),
                errors::FailedPrecondition(
                    Prefix(), "needs a Python interpreter (tftrt_py)"));

    std::string function_def, callees;
    FunctionLibraryRuntime* lib = ctx->function_library();
    if (!func_.name().empty() && lib != nullptr) {
      const tensorflow::FunctionLibraryDefinition* defs =
          lib->GetFunctionLibraryDefinition();
      const tensorflow::FunctionDef* fdef = defs->Find(func_.name());
      if (fdef != nullptr) {
        function_def = fdef->SerializeAsString();
        callees = Callees(*defs, *fdef).SerializeAsString();
      }
    }
    const std::string node_def = def().SerializeAsString();

    Gil gil;
    PyRef nd(PyBytes_FromStringAndSize(node_def.data(), node_def.size()));
    PyRef fd(PyBytes_FromStringAndSize(function_def.data(), function_def.size()));
    PyRef cd(PyBytes_FromStringAndSize(callees.data(), callees.size()));
    PyRef result;
    if (nd && fd && cd) {
      result.reset(CallDispatcher("create", nd.get(), fd.get(), cd.get()));
    }
    OP_REQUIRES(ctx, result != nullptr,
                StatusFromPyErr(Prefix() + "dispatcher.create failed: "));
    handle_ = PyLong_AsLongLong(result.get());
    OP_REQUIRES(ctx, !(handle_ == -1 && PyErr_Occurred()),
                StatusFromPyErr(Prefix() + "dispatcher.create must return "
                                           "an int handle: "));
    created_ = true;
  }

  // Every function `root` reaches through its nodes (called as ops or named
  // in func attrs), transitively, `root` itself excluded unless reached again:
  // dispatcher.create refuses segments that would recurse through them.
  static tensorflow::FunctionDefLibrary Callees(
      const tensorflow::FunctionLibraryDefinition& defs,
      const tensorflow::FunctionDef& root) {
    tensorflow::FunctionDefLibrary out;
    std::set<std::string> seen;
    std::vector<const tensorflow::FunctionDef*> todo = {&root};
    auto visit = [&](const std::string& name) {
      const tensorflow::FunctionDef* f = defs.Find(name);
      if (f == nullptr || !seen.insert(name).second) return;
      *out.add_function() = *f;
      todo.push_back(f);
    };
    while (!todo.empty()) {
      const tensorflow::FunctionDef* f = todo.back();
      todo.pop_back();
      for (const tensorflow::NodeDef& node : f->node_def()) {
        visit(node.op());
        for (const auto& attr : node.attr()) {
          if (attr.second.has_func()) visit(attr.second.func().name());
          for (const auto& g : attr.second.list().func()) visit(g.name());
        }
      }
    }
    return out;
  }

  ~TRTEngineOp() override {
    // Kernels can outlive the interpreter (process exit): skip Python then.
    if (!created_ || !PythonUsable()) return;
    Gil gil;
    {
      tensorflow::mutex_lock lock(replay_mu_);
      for (auto& r : replays_) Py_XDECREF(r->keep);
      replays_.clear();
    }
    PyRef h(PyLong_FromLongLong(handle_));
    PyRef r(h ? CallDispatcher("release", h.get()) : nullptr);
    if (!r) PyErr_Clear();  // errors on release are swallowed
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int64_t entered = Nanoseconds();
    bool served = false;
    std::string key;
    bool ask = false;  // whether to ask Python for a replay of these shapes
    if (replays_offered_.load(std::memory_order_relaxed)) {
      key = ReplayKey(ctx);
      Replay* replay = AcquireReplay(key, &ask);
      if (replay != nullptr) {
        const absl::Status s = RunReplay(ctx, replay, &served);
        if (served) replay->Add(5, Nanoseconds() - entered);
        // Not touched after this: once idle, a revoked replay may be dropped.
        ReleaseReplay(replay, /*failed=*/s.ok() && !served);
        OP_REQUIRES_OK_ASYNC(ctx, s, done);
        if (served) {
          done();
          return;
        }
      }
    }
    // Python part; the GIL is taken and released inside.
    OP_REQUIRES_OK_ASYNC(ctx, RunDispatcher(ctx, ask ? &key : nullptr, &served), done);
    if (served) {
      done();
      return;
    }
    ExecuteNativeSegment(ctx, std::move(done));
  }

 private:
  std::string Prefix() const { return absl::StrCat("TRTEngineOp ", name(), ": "); }

  // The dtypes and shapes of the inputs engines bind: what a replay serves.
  std::string ReplayKey(OpKernelContext* ctx) const {
    std::string key;
    for (int i : engine_inputs_) {
      const Tensor& t = ctx->input(i);
      absl::StrAppend(&key, static_cast<int>(t.dtype()), ":");
      for (int d = 0; d < t.dims(); ++d) absl::StrAppend(&key, t.dim_size(d), ",");
      key += ';';
    }
    return key;
  }

  // An idle usable replay for `key`, marked busy; null when Python serves the
  // call (no replay for `key`, or fewer than its limit: *ask says whether to
  // ask for one after the run). When `limit` replays are all running, waits
  // for one of them.
  Replay* AcquireReplay(const std::string& key, bool* ask) {
    tensorflow::mutex_lock lock(replay_mu_);
    while (true) {
      uint64_t usable = 0, limit = 0;
      for (auto& r : replays_) {
        if (r->key != key || !r->usable()) continue;
        if (!r->busy) {
          r->busy = true;
          return r.get();
        }
        ++usable;
        limit = r->limit;
      }
      if (usable == 0 || usable < limit) {
        if (replay_wait_.size() > 1024) replay_wait_.clear();  // bounded (many shapes)
        if (replay_asks_.size() > 1024) replay_asks_.clear();
        int& wait = replay_wait_[key];
        int& asking = replay_asks_[key];
        // Concurrent callers ask for no more replays than the limit (one
        // before the first replay says what the limit is).
        *ask = wait <= 0 && usable + asking < std::max<uint64_t>(limit, 1);
        if (*ask) {
          ++asking;
        } else if (wait > 0) {
          --wait;
        }
        return nullptr;
      }
      replay_cv_.wait(lock);
    }
  }

  void ReleaseReplay(Replay* replay, bool failed) {
    tensorflow::mutex_lock lock(replay_mu_);
    replay->busy = false;
    replay->failed = replay->failed || failed;
    replay_cv_.notify_all();
  }

  // fn(from, to) over the kChunkBytes chunks of `nbytes` bytes, in parallel
  // on TF's CPU workers (one call when small).
  static void ForChunks(OpKernelContext* ctx, size_t nbytes,
                        const std::function<void(size_t, size_t)>& fn) {
    const auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    if (nbytes <= kChunkBytes || threads == nullptr || threads->workers == nullptr) {
      fn(0, nbytes);
      return;
    }
    const int64_t chunks = static_cast<int64_t>((nbytes + kChunkBytes - 1) / kChunkBytes);
    threads->workers->ParallelFor(chunks, /*cost_per_unit=*/1 << 20, [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        fn(c * kChunkBytes, std::min(nbytes, (c + 1) * kChunkBytes));
      }
    });
  }

  // Copies input `src` into the replay's pinned buffer, each chunk's DMA
  // queued as soon as it is in (from the worker that copied it, so DMAs
  // overlap the copying of later chunks). A CUDA error code, or 0.
  static int CopyIn(OpKernelContext* ctx, const Replay& r, const Replay::Buffer& b,
                    const char* src) {
    std::atomic<int> rc{0};
    ForChunks(ctx, b.nbytes, [&](size_t from, size_t to) {
      std::memcpy(b.pinned + from, src + from, to - from);
      int e = r.set_context(r.context);  // a worker's thread may not have it
      if (e == 0) e = r.to_device(b.device + from, b.pinned + from, to - from, r.stream);
      if (e != 0) rc.store(e);
    });
    return rc.load();
  }

  // Runs `replay` on the op's inputs into its outputs (no GIL): *served=false
  // when a CUDA call failed (logged; Python serves the call instead).
  absl::Status RunReplay(OpKernelContext* ctx, Replay* replay, bool* served) {
    const Replay& r = *replay;
    const int64_t start = Nanoseconds();
    int rc = r.set_context(r.context);
    for (size_t i = 0; rc == 0 && i < r.inputs.size(); ++i) {
      rc = CopyIn(ctx, r, r.inputs[i], ctx->input(engine_inputs_[i]).tensor_data().data());
    }
    const int64_t copied = Nanoseconds();
    if (rc == 0) rc = r.launch(r.graph, r.stream);
    // Each output lands in a pinned block that becomes TF's tensor, or (all
    // blocks held by TF) in the replay's own buffer, copied into TF's below.
    std::vector<char*> landed(r.outputs.size(), nullptr);
    for (size_t i = 0; rc == 0 && i < r.outputs.size(); ++i) {
      landed[i] = r.outputs[i].blocks->Acquire();
      char* dst = landed[i] != nullptr ? landed[i] : r.outputs[i].pinned;
      rc = r.to_host(dst, r.outputs[i].device, r.outputs[i].nbytes, r.stream);
    }
    if (rc == 0) rc = r.synchronize(r.stream);
    const int64_t synchronized = Nanoseconds();
    if (rc != 0) {
      for (size_t i = 0; i < r.outputs.size(); ++i) {
        if (landed[i] != nullptr) r.outputs[i].blocks->Release(landed[i]);
      }
      Gil gil;
      Warn(absl::StrCat(Prefix(), "native replay failed (CUDA error ", rc,
                        "); calls of these shapes go through Python"));
      *served = false;
      return absl::OkStatus();
    }
    int64_t handed = 0;
    for (size_t i = 0; i < r.outputs.size(); ++i) {
      const Replay::Buffer& b = r.outputs[i];
      if (landed[i] != nullptr) {
        auto* buffer = new PinnedTensorBuffer(b.blocks, landed[i]);
        ctx->set_output(static_cast<int>(i), Tensor(out_types_[i], b.shape, buffer));
        buffer->Unref();  // the tensor holds it now
        ++handed;
        continue;
      }
      Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(static_cast<int>(i), b.shape, &out));
      char* dst = const_cast<char*>(out->tensor_data().data());
      const char* src = b.pinned;
      ForChunks(ctx, b.nbytes, [&](size_t from, size_t to) {
        std::memcpy(dst + from, src + from, to - from);
      });
    }
    replay->Add(6, handed);
    replay->Add(7, static_cast<int64_t>(r.outputs.size()) - handed);
    replay->Add(1, 1);
    replay->Add(2, copied - start);
    replay->Add(3, synchronized - copied);
    replay->Add(4, Nanoseconds() - synchronized);
    *served = true;
    return absl::OkStatus();
  }

  // Drops replays Python revoked or that failed (GIL held).
  void DropUnusableReplays() {
    std::vector<PyObject*> keep;
    {
      tensorflow::mutex_lock lock(replay_mu_);
      for (auto it = replays_.begin(); it != replays_.end();) {
        if (!(*it)->busy && !(*it)->usable()) {
          keep.push_back((*it)->keep);
          it = replays_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (PyObject* k : keep) Py_XDECREF(k);
  }

  // dispatcher.replay for `key` after a served run (GIL held): keeps the
  // replay offered, stops asking on False, waits kReplayRetry runs on None.
  // Errors are logged, never the call's.
  void AskForReplay(OpKernelContext* ctx, PyObject* handle, PyObject* inputs,
                    const std::string& key) {
    PyRef result(CallDispatcher("replay", handle, inputs));
    {
      tensorflow::mutex_lock lock(replay_mu_);
      auto asking = replay_asks_.find(key);
      if (asking != replay_asks_.end() && --asking->second <= 0) replay_asks_.erase(asking);
    }
    std::unique_ptr<Replay> replay;
    PyObject* keep = nullptr;
    if (result && result.get() == Py_False) {
      replays_offered_.store(false, std::memory_order_relaxed);
      return;
    }
    if (result && result.get() != Py_None) {
      PyObject* packed = nullptr;
      if (PyArg_ParseTuple(result.get(), "OO", &packed, &keep)) {
        replay = ParseReplay(packed, ctx, engine_inputs_, out_types_);
      }
    }
    if (PyErr_Occurred()) {
      Warn(std::string(StatusFromPyErr(Prefix() + "no native replay: ").message()));
    }
    tensorflow::mutex_lock lock(replay_mu_);
    if (!replay) {
      replay_wait_[key] = kReplayRetry;
      return;
    }
    Py_INCREF(keep);
    replay->keep = keep;
    replay->key = key;
    replay_wait_.erase(key);
    replays_.push_back(std::move(replay));
    replay_cv_.notify_all();
  }

  // Calls dispatcher.run; on a list result sets the outputs and *served=true,
  // on None leaves *served=false; then, when `replay_key` is given, asks for a
  // native replay of these shapes. Holds the GIL only within.
  absl::Status RunDispatcher(OpKernelContext* ctx, const std::string* replay_key,
                             bool* served) {
    const int n_in = static_cast<int>(in_types_.size());
    Gil gil;
    DropUnusableReplays();
    PyRef inputs(PyList_New(n_in));
    if (!inputs) return StatusFromPyErr(Prefix());
    for (int i = 0; i < n_in; ++i) {
      const Tensor& t = ctx->input(i);
      const char* dtype = NumpyName(t.dtype());
      if (dtype == nullptr) {
        return errors::InvalidArgument(Prefix(), "input ", i, " has dtype ",
                                       tensorflow::DataTypeString(t.dtype()),
                                       ", which is not supported");
      }
      PyRef shape(PyTuple_New(t.dims()));
      if (!shape) return StatusFromPyErr(Prefix());
      for (int d = 0; d < t.dims(); ++d) {
        PyObject* dim = PyLong_FromLongLong(t.dim_size(d));
        if (dim == nullptr) return StatusFromPyErr(Prefix());
        PyTuple_SET_ITEM(shape.get(), d, dim);  // steals `dim`
      }
      PyRef view(TensorView(t, /*writable=*/false));
      if (!view) return StatusFromPyErr(Prefix());
      PyObject* item = Py_BuildValue("(sOO)", dtype, shape.get(), view.get());
      if (item == nullptr) return StatusFromPyErr(Prefix());
      PyList_SET_ITEM(inputs.get(), i, item);  // steals `item`
    }

    PyRef assets(PyList_New(0));
    if (!assets) return StatusFromPyErr(Prefix());
    for (int i = n_in; i < ctx->num_inputs(); ++i) {  // engine_assets
      auto flat = ctx->input(i).flat<tensorflow::tstring>();
      for (int64_t j = 0; j < flat.size(); ++j) {
        PyRef b(PyBytes_FromStringAndSize(flat(j).data(), flat(j).size()));
        if (!b || PyList_Append(assets.get(), b.get()) != 0) {
          return StatusFromPyErr(Prefix());
        }
      }
    }

    PyRef handle(PyLong_FromLongLong(handle_));
    if (!handle) return StatusFromPyErr(Prefix());
    PyTypeObject* alloc_type = OutputAllocatorType();
    if (alloc_type == nullptr) return StatusFromPyErr(Prefix());
    std::vector<const char*> allocated(out_types_.size(), nullptr);
    auto* alloc = PyObject_New(OutputAllocator, alloc_type);
    if (alloc == nullptr) return StatusFromPyErr(Prefix());
    alloc->ctx = ctx;
    alloc->data = &allocated;
    PyRef allocate(reinterpret_cast<PyObject*>(alloc));
    PyRef result(CallDispatcher("run", handle.get(), inputs.get(), assets.get(),
                                allocate.get()));
    alloc->ctx = nullptr;  // Python may keep it: it must not reach ctx later
    alloc->data = nullptr;
    if (!result) return StatusFromPyErr(Prefix());
    if (result.get() == Py_None) return absl::OkStatus();

    PyRef seq(PySequence_Fast(result.get(), ""));
    if (!seq) {
      PyErr_Clear();
      return errors::InvalidArgument(
          Prefix(), "dispatcher.run must return a list of arrays or None, got ",
          Py_TYPE(result.get())->tp_name);
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.get());
    if (n != static_cast<Py_ssize_t>(out_types_.size())) {
      return errors::InvalidArgument(Prefix(), "dispatcher.run returned ", n,
                                     " outputs; expected ", out_types_.size());
    }
    for (int i = 0; i < n; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq.get(), i);
      if (allocated[i] != nullptr && WrittenInPlace(item, allocated[i])) continue;
      TF_RETURN_IF_ERROR(SetOutput(ctx, i, item));
    }
    *served = true;
    if (replay_key != nullptr) AskForReplay(ctx, handle.get(), inputs.get(), *replay_key);
    return absl::OkStatus();
  }

  // Whether `obj` is the output buffer allocate() returned (starting at
  // `data`): the engine wrote the output in place. GIL held.
  static bool WrittenInPlace(PyObject* obj, const char* data) {
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      return false;
    }
    const bool same = b.buf == data;
    PyBuffer_Release(&b);
    return same;
  }

  // Copies array `obj` (any C-contiguous buffer) into output i. GIL held.
  // Its shape is not checked against output_shapes, as TF-TRT does not: an
  // input outside the signature's static dims gives outputs outside them.
  absl::Status SetOutput(OpKernelContext* ctx, int i, PyObject* obj) {
    const DataType dt = out_types_[i];
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      const std::string why(StatusFromPyErr("").message());
      return errors::InvalidArgument(
          Prefix(), "output ", i, " of dispatcher.run (",
          Py_TYPE(obj)->tp_name, ") is not a C-contiguous ", NumpyName(dt),
          " array: ", why);
    }
    // Released on every path below; holding a Py_buffer needs no GIL.
    std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> release(&b, PyBuffer_Release);

    const std::string fmt = NativeFormat(b);
    if (!BufferMatches(b, fmt, dt)) {
      return errors::InvalidArgument(Prefix(), "output ", i,
                                     " of dispatcher.run has dtype ",
                                     BufferDtypeName(b, fmt), "; expected ",
                                     NumpyName(dt));
    }
    TensorShape shape;
    for (int d = 0; d < b.ndim; ++d) {
      TF_RETURN_IF_ERROR(shape.AddDimWithStatus(b.shape[d]));
    }
    if (shape.num_elements() * b.itemsize != b.len) {
      return errors::InvalidArgument(Prefix(), "output ", i,
                                     " of dispatcher.run: buffer of ", b.len,
                                     " bytes for shape ", shape.DebugString());
    }
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(i, shape, &out));
    if (b.len > 0) {
      auto dst = out->tensor_data();
      if (b.len >= (1 << 16)) {  // let other Python threads run meanwhile
        Py_BEGIN_ALLOW_THREADS
        std::memcpy(const_cast<char*>(dst.data()), b.buf, b.len);
        Py_END_ALLOW_THREADS
      } else {
        std::memcpy(const_cast<char*>(dst.data()), b.buf, b.len);
      }
    }
    return absl::OkStatus();
  }

  // Runs segment_func on the in_tensor inputs (no GIL held here).
  void ExecuteNativeSegment(OpKernelContext* ctx, DoneCallback done) {
    OP_REQUIRES_ASYNC(
        ctx, !func_.name().empty(),
        errors::FailedPrecondition(Prefix(),
                                   "no engine can serve this input and the "
                                   "native segment is unavailable"),
        done);
    FunctionLibraryRuntime* lib = ctx->function_library();
    OP_REQUIRES_ASYNC(ctx, lib != nullptr,
                      errors::Internal(Prefix(), "no function library"), done);
    FunctionLibraryRuntime::Handle handle;
    absl::Status status;
    {
      // Instantiated once per function library runtime, then cached.
      tensorflow::mutex_lock lock(mu_);
      if (func_lib_ != lib) {
        FunctionLibraryRuntime::InstantiateOptions inst;
        inst.target = ctx->device()->name();
        status = lib->Instantiate(func_.name(),
                                  tensorflow::AttrSlice(&func_.attr()), inst,
                                  &func_handle_);
        if (status.ok()) {
          func_lib_ = lib;
        } else {
          status = absl::Status(
              status.code(), absl::StrCat(Prefix(), "instantiating segment_func ",
                                          func_.name(), ": ", status.message()));
        }
      }
      handle = func_handle_;
    }
    OP_REQUIRES_OK_ASYNC(ctx, status, done);

    FunctionLibraryRuntime::Options opts(ctx->step_id());
    opts.rendezvous = ctx->rendezvous();
    opts.cancellation_manager = ctx->cancellation_manager();
    opts.collective_executor = ctx->collective_executor();
    opts.step_container = ctx->step_container();
    opts.stats_collector = ctx->stats_collector();
    opts.runner = ctx->runner();
    opts.run_all_kernels_inline = ctx->run_all_kernels_inline();

    std::vector<Tensor> args;
    args.reserve(in_types_.size());
    for (size_t i = 0; i < in_types_.size(); ++i) args.push_back(ctx->input(i));
    // Owned by the callback; ctx stays valid until done() is called.
    auto* rets = new std::vector<Tensor>();
    lib->Run(opts, handle, args, rets,
             [this, ctx, rets, done = std::move(done)](const absl::Status& s) {
               std::unique_ptr<std::vector<Tensor>> owned(rets);
               if (!s.ok()) {
                 ctx->SetStatus(absl::Status(
                     s.code(), absl::StrCat(Prefix(), "native segment ",
                                            func_.name(), ": ", s.message())));
                 done();
                 return;
               }
               OP_REQUIRES_ASYNC(
                   ctx, rets->size() == out_types_.size(),
                   errors::Internal(Prefix(), "native segment returned ",
                                    rets->size(), " outputs; expected ",
                                    out_types_.size()),
                   done);
               for (size_t i = 0; i < rets->size(); ++i) {
                 OP_REQUIRES_ASYNC(
                     ctx, (*rets)[i].dtype() == out_types_[i],
                     errors::Internal(
                         Prefix(), "native segment output ", i, " is ",
                         tensorflow::DataTypeString((*rets)[i].dtype()),
                         "; expected ",
                         tensorflow::DataTypeString(out_types_[i])),
                     done);
                 ctx->set_output(i, (*rets)[i]);
               }
               done();
             });
  }

  tensorflow::NameAttrList func_;
  DataTypeVector in_types_;
  DataTypeVector out_types_;
  std::vector<int> engine_inputs_;  // the inputs engines bind, in order
  int64_t handle_ = 0;   // from dispatcher.create
  bool created_ = false;  // whether release() is owed

  // Native replays; replay_mu_ is never held while taking the GIL.
  std::atomic<bool> replays_offered_{true};  // false once Python said never
  tensorflow::mutex replay_mu_;
  tensorflow::condition_variable replay_cv_;
  std::vector<std::unique_ptr<Replay>> replays_ TF_GUARDED_BY(replay_mu_);
  std::map<std::string, int> replay_wait_ TF_GUARDED_BY(replay_mu_);
  std::map<std::string, int> replay_asks_ TF_GUARDED_BY(replay_mu_);  // asks in flight, by key

  tensorflow::mutex mu_;
  FunctionLibraryRuntime* func_lib_ TF_GUARDED_BY(mu_) = nullptr;
  FunctionLibraryRuntime::Handle func_handle_ TF_GUARDED_BY(mu_) =
      tensorflow::kInvalidHandle;
};

REGISTER_OP("TRTEngineOp")
    .Input("in_tensor: InT")
    .Input("engine_assets: Tassets")
    .Output("out_tensor: OutT")
    .Attr("serialized_segment: string = ''")
    .Attr("segment_func: func = {}")
    .Attr("InT: list({bool,int8,float16,float32,int32,int64}) >= 0")
    .Attr("OutT: list({bool,int8,float16,float32,int32,int64}) >= 1")
    .Attr("Tassets: list({string}) >= 0 = []")
    .Attr("input_shapes: list(shape) = []")
    .Attr("output_shapes: list(shape) = []")
    .Attr("max_cached_engines_count: int = 1")
    .Attr("max_batch_size: int = 1")
    .Attr("workspace_size_bytes: int = 1073741824")
    .Attr("precision_mode: {'FP32', 'FP16', 'INT8', 'FP8'} = 'FP32'")
    .Attr("calibration_data: string = ''")
    .Attr("use_calibration: bool = true")
    .Attr("static_engine: bool = true")
    .Attr("profile_strategy: string = ''")
    .Attr("segment_key: string = ''")
    // TF-TRT's deprecated attrs, accepted so graphs written by TF-TRT load.
    .Attr("segment_funcdef_name: string = ''")
    .Attr("cached_engine_batches: list(int) >= 0 = []")
    .Attr("fixed_input_size: bool = true")
    .Attr("use_explicit_precision: bool = false")
    // Stateful: grappler must neither constant-fold an engine op (that would run it at
    // optimization time, without its native segment) nor merge two of them.
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
      if (!shapes.empty() && static_cast<int>(shapes.size()) != c->num_outputs()) {
        return errors::InvalidArgument("TRTEngineOp: ", shapes.size(),
                                       " output_shapes for ", c->num_outputs(),
                                       " outputs");
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        tensorflow::shape_inference::ShapeHandle h = c->UnknownShape();
        if (!shapes.empty()) {
          TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &h));
        }
        c->set_output(i, h);
      }
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("TRTEngineOp").Device(tensorflow::DEVICE_CPU),
                        TRTEngineOp);

// ---------------------------------------------------------------------------
// TF-TRT's online conversion: the Grappler custom optimizer a session names in
// its rewrite options (trt_convert.get_tensorrt_rewriter_config). It hands the
// graph to tftrt_py.converters.online.optimize(item_id: str, graph_def: bytes,
// fetch: list[str], config: bytes) -> bytes | None (None: unchanged), config
// being the serialized RewriterConfig.CustomGraphOptimizer (its parameter_map).
class TensorRTOptimizer : public tensorflow::grappler::CustomGraphOptimizer {
 public:
  std::string name() const override { return "TensorRTOptimizer"; }
  bool UsesFunctionLibrary() const override { return true; }

  absl::Status Init(
      const tensorflow::RewriterConfig_CustomGraphOptimizer* config) override {
    if (config != nullptr) config_ = config->SerializeAsString();
    return absl::OkStatus();
  }

  absl::Status Optimize(tensorflow::grappler::Cluster* cluster,
                        const tensorflow::grappler::GrapplerItem& item,
                        tensorflow::GraphDef* optimized_graph) override {
    *optimized_graph = item.graph;
    if (!PythonUsable()) return absl::OkStatus();
    const std::string graph = item.graph.SerializeAsString();
    Gil gil;
    PyRef id(PyUnicode_FromStringAndSize(item.id.data(), item.id.size()));
    PyRef gd(PyBytes_FromStringAndSize(graph.data(), graph.size()));
    PyRef cfg(PyBytes_FromStringAndSize(config_.data(), config_.size()));
    PyRef fetch(PyList_New(0));
    if (!id || !gd || !cfg || !fetch) return StatusFromPyErr(Prefix());
    for (const std::string& f : item.fetch) {
      PyRef name(PyUnicode_FromStringAndSize(f.data(), f.size()));
      if (!name || PyList_Append(fetch.get(), name.get()) != 0) {
        return StatusFromPyErr(Prefix());
      }
    }
    PyRef result(CallPython(kOnlineModule, "optimize", id.get(), gd.get(),
                            fetch.get(), cfg.get()));
    if (!result) return StatusFromPyErr(Prefix());
    if (result.get() == Py_None) return absl::OkStatus();
    char* data = nullptr;
    Py_ssize_t size = 0;
    if (PyBytes_AsStringAndSize(result.get(), &data, &size) != 0) {
      return StatusFromPyErr(Prefix() + "optimize must return bytes or None: ");
    }
    if (!optimized_graph->ParseFromArray(data, static_cast<int>(size))) {
      *optimized_graph = item.graph;
      return errors::Internal(Prefix(), "optimize returned no GraphDef");
    }
    return absl::OkStatus();
  }

 private:
  static std::string Prefix() { return "TensorRTOptimizer: "; }

  std::string config_;
};

REGISTER_GRAPH_OPTIMIZER_AS(TensorRTOptimizer, "TensorRTOptimizer");

}  // namespace tftrt_py

// What this build is for (TensorFlow, Python and kernel versions): library.py
// reads it from the file before loading a prebuilt library.
#ifndef TFTRT_PY_BUILD_TAG
#define TFTRT_PY_BUILD_TAG "unknown"
#endif
extern "C" __attribute__((visibility("default"), used)) const char
    tftrt_py_build_tag[] = "tftrt_py-build-tag:" TFTRT_PY_BUILD_TAG;
