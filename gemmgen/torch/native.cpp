// torch.ops.gemmgen.matmul's CUDA and Autograd kernels in C++ (gemmgen/torch/native.py builds this
// file as a PyTorch C++ extension and calls install()).
//
// The dispatcher reaches a kernel written in Python through a boxed call: its arguments are made
// Python objects, the GIL is taken, and the result is unboxed again. That costs a few microseconds
// a call, more than the rest of a prepared launch. Here a call that needs no gradient stays in C++:
//
//   Autograd kernel: a gradient needed -> a C++ autograd Function (MatmulFunction) whose backward
//                    is this operator again; else redispatch below autograd. Either way no Python
//                    object is made per call (Python's autograd.Function made several, and their
//                    collections stalled a training step: BENCHMARKS.md, 2026-11-26).
//   CUDA kernel:     one lookup by what decides the launch (precision, device, sizes, strides,
//                    A's and B's address % 16) -> the output's allocation and one cuLaunchKernelEx
//                    per prepared step, on PyTorch's current stream.
//
// Python decides everything once per call key (library/dispatch.py resolves the member and its
// PreparedLaunch; native.py describes that launch: functions, launch configurations, argument
// buffers and where a call's values go). A key Python serves itself (operands it must copy first,
// a wrong argument, which it reports) is sent back to Python on every call. Tensor maps (TMA
// kernels) and stream-K workspaces come from Python's own caches on a miss only / per call.

#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// --- libcuda, by the addresses Python's ctypes found (no link against it, no CUDA headers) -------

using CtxGetCurrent = int (*)(void**);
using CtxSetCurrent = int (*)(void*);
using LaunchKernelEx = int (*)(const void*, void*, void**, void**);

struct LaunchConfig {  // CUlaunchConfig, as cuda.h lays it out (no launch attributes)
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
    void* stream;
    void* attributes;
    unsigned attribute_count;
};

struct Python {  // what install() was given; never freed (the interpreter may be gone at exit)
    py::object describe, fallback, error_text;
    CtxGetCurrent ctx_get = nullptr;
    CtxSetCurrent ctx_set = nullptr;
    LaunchKernelEx launch = nullptr;
};
Python* python = nullptr;

// --- a prepared launch, as Python described it ---------------------------------------------------

constexpr int TENSOR_MAP_BYTES = 128;
constexpr size_t MAPS_KEPT = 1024;  // per operand's map, as gpu/launch.py's MAPS_KEPT (why: there)

struct Write {  // a call's value into the argument buffer
    size_t offset;
    char kind;  // 'f' float, 'i' int32, 'q' int64, 'Q' address
    int source;  // 0 A, 1 B, 2 C, 3 alpha, 4 beta; others (reductions, vectors) are 0 here
};

struct MapSlot {  // a tensor map written per call: its bytes by address, from Python on a miss
    size_t offset;
    int source;
    py::object get;  // get(address) -> bytes
    std::unordered_map<uint64_t, std::array<uint8_t, TENSOR_MAP_BYTES>> kept;  // emptied when full
};

struct Step {
    void* function = nullptr;
    LaunchConfig config{};
    std::unique_ptr<uint8_t[]> memory;  // the argument buffer, 64-byte aligned inside
    uint8_t* buffer = nullptr;
    std::vector<void*> params;  // kernelParams: each parameter's address in the buffer
    std::vector<Write> writes;
    std::vector<MapSlot> maps;
    bool has_workspace = false;
    size_t workspace_offset = 0;
    py::object workspace;  // workspace(stream) -> address
    std::string what;
};

struct Entry {
    bool python_serves = false;  // Python runs this key itself (copies first, or reports an error)
    bool swap = false;           // A and B change places (the library computes C^T = B^T A^T)
    std::vector<int64_t> shape;
    void* context = nullptr;
    std::vector<Step> steps;
    py::object keep;  // the PreparedLaunch whose functions these are
    std::mutex lock;  // guards the buffers and the map caches

    Entry() = default;
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    // The last owner may be any thread, with or without the GIL (an entry dropped from `calls` while a
    // call still runs it): its Python objects are released holding the GIL.
    ~Entry() {
        py::gil_scoped_acquire gil;
        steps.clear();
        keep = py::object();
    }
};

// --- the call key -------------------------------------------------------------------------------

constexpr int MAX_DIMS = 8;

struct Key {
    std::array<int64_t, 4 + 4 * MAX_DIMS + 2> v{};
    int n = 0;
    void push(int64_t x) { v[n++] = x; }
    bool operator==(const Key& o) const {
        return n == o.n && std::memcmp(v.data(), o.v.data(), sizeof(int64_t) * n) == 0;
    }
};

struct KeyHash {
    size_t operator()(const Key& k) const {
        uint64_t h = 1469598103934665603ull;
        for (int i = 0; i < k.n; ++i) h = (h ^ static_cast<uint64_t>(k.v[i])) * 1099511628211ull;
        return static_cast<size_t>(h);
    }
};

constexpr size_t CALLS_KEPT = 4096;  // as library/dispatch.py keeps its call keys
// Never freed, as `python` is not: at exit their Python objects would be released after the
// interpreter is gone.
std::mutex& calls_lock = *new std::mutex;
auto& calls = *new std::unordered_map<Key, std::shared_ptr<Entry>, KeyHash>;

at::Tensor call_python(const py::object& function, const at::Tensor& a, const at::Tensor& b, double alpha,
                       c10::string_view precision) {
    py::gil_scoped_acquire gil;
    py::object out = function(a, b, alpha, std::string(precision));
    return out.cast<at::Tensor>();
}

std::string cuda_error(int status) {
    py::gil_scoped_acquire gil;
    return python->error_text(status).cast<std::string>();
}

// The entry Python describes for a key: (swap, shape, context, steps, keep), or None where Python
// serves the key itself. Called with the GIL held.
std::shared_ptr<Entry> describe(const at::Tensor& a, const at::Tensor& b, double alpha, c10::string_view precision) {
    auto entry = std::make_shared<Entry>();
    py::object found = python->describe(a, b, alpha, std::string(precision));
    if (found.is_none()) {
        entry->python_serves = true;
        return entry;
    }
    auto t = found.cast<py::tuple>();
    entry->swap = t[0].cast<bool>();
    entry->shape = t[1].cast<std::vector<int64_t>>();
    entry->context = reinterpret_cast<void*>(t[2].cast<uintptr_t>());
    for (auto item : t[3].cast<py::list>()) {
        auto s = item.cast<py::tuple>();
        Step step;
        step.function = reinterpret_cast<void*>(s[0].cast<uintptr_t>());
        std::string config = s[1].cast<std::string>();
        TORCH_CHECK(config.size() == sizeof(LaunchConfig), "gemmgen: a launch configuration of ", config.size(),
                    " bytes, expected ", sizeof(LaunchConfig));
        std::memcpy(&step.config, config.data(), sizeof(LaunchConfig));
        std::string arguments = s[2].cast<std::string>();
        step.memory.reset(new uint8_t[arguments.size() + 64]);
        step.buffer = step.memory.get() + (-reinterpret_cast<uintptr_t>(step.memory.get()) % 64);
        std::memcpy(step.buffer, arguments.data(), arguments.size());
        for (auto offset : s[3].cast<std::vector<size_t>>()) step.params.push_back(step.buffer + offset);
        for (auto w : s[4].cast<py::list>()) {
            auto wt = w.cast<py::tuple>();
            step.writes.push_back({wt[0].cast<size_t>(), wt[1].cast<std::string>().at(0), wt[2].cast<int>()});
        }
        for (auto m : s[5].cast<py::list>()) {
            auto mt = m.cast<py::tuple>();
            step.maps.push_back({mt[0].cast<size_t>(), mt[1].cast<int>(), mt[2], {}});
        }
        if (!s[6].is_none()) {
            auto wt = s[6].cast<py::tuple>();
            step.has_workspace = true;
            step.workspace_offset = wt[0].cast<size_t>();
            step.workspace = wt[1];
        }
        step.what = s[7].cast<std::string>();
        entry->steps.push_back(std::move(step));
    }
    entry->keep = t[4];
    return entry;
}

template <typename T>
void put(uint8_t* buffer, size_t offset, T value) {
    std::memcpy(buffer + offset, &value, sizeof(T));
}

// The tensor map of `address` for a slot: kept, or Python's (GIL taken; the entry's lock is not
// held meanwhile, so that a thread holding the GIL and waiting for that lock cannot deadlock).
const uint8_t* tensor_map(Entry& entry, std::unique_lock<std::mutex>& held, MapSlot& slot, uint64_t address) {
    auto found = slot.kept.find(address);
    if (found != slot.kept.end()) return found->second.data();
    held.unlock();
    std::array<uint8_t, TENSOR_MAP_BYTES> bytes{};
    {
        py::gil_scoped_acquire gil;
        std::string got = slot.get(address).cast<std::string>();
        TORCH_CHECK(got.size() == TENSOR_MAP_BYTES, "gemmgen: a tensor map of ", got.size(), " bytes");
        std::memcpy(bytes.data(), got.data(), TENSOR_MAP_BYTES);
    }
    held.lock();
    if (slot.kept.size() >= MAPS_KEPT) slot.kept.clear();
    // insert_or_assign: another thread may have kept this address while the lock was let go.
    return slot.kept.insert_or_assign(address, bytes).first->second.data();
}

// The device's context current in this thread while a launch runs, the caller's given back after
// (also when a workspace's getter raises). First of all: a workspace made for a new stream asks the
// driver about it, and autograd's backward threads may have no context current.
struct CurrentContext {
    void* previous = nullptr;
    bool switched = false;
    explicit CurrentContext(void* context) {
        python->ctx_get(&previous);
        if (previous == context) return;
        int status = python->ctx_set(context);
        TORCH_CHECK(status == 0, "gemmgen: making the device's context current: ", cuda_error(status));
        switched = true;
    }
    ~CurrentContext() {
        if (switched) python->ctx_set(previous);
    }
};

void launch(Entry& entry, uint64_t pa, uint64_t pb, uint64_t pc, float alpha, void* stream) {
    const uint64_t pointers[3] = {pa, pb, pc};
    CurrentContext current(entry.context);
    // Workspaces before the entry's lock (Python's own lock guards its workspaces).
    std::vector<uint64_t> workspaces(entry.steps.size(), 0);
    for (size_t i = 0; i < entry.steps.size(); ++i)
        if (entry.steps[i].has_workspace) {
            py::gil_scoped_acquire gil;
            workspaces[i] = entry.steps[i].workspace(reinterpret_cast<uintptr_t>(stream)).cast<uint64_t>();
        }
    std::unique_lock<std::mutex> held(entry.lock);
    // Every tensor map at hand before any buffer is written: a map not kept lets the lock go while
    // Python encodes it, and another thread's call of this key may fill the buffers and launch
    // meanwhile (its pointers were then launched with this call's, and this call's output not written).
    std::vector<std::array<uint8_t, TENSOR_MAP_BYTES>> maps;
    for (Step& step : entry.steps)
        for (MapSlot& slot : step.maps) {
            const uint8_t* bytes = tensor_map(entry, held, slot, slot.source <= 2 ? pointers[slot.source] : 0);
            maps.emplace_back();
            std::memcpy(maps.back().data(), bytes, TENSOR_MAP_BYTES);
        }
    size_t next_map = 0;
    int failed = 0;
    std::string what;
    for (size_t i = 0; i < entry.steps.size() && !failed; ++i) {
        Step& step = entry.steps[i];
        for (const Write& w : step.writes) {
            if (w.source <= 2) {
                put<uint64_t>(step.buffer, w.offset, pointers[w.source]);
            } else if (w.kind == 'f') {
                put<float>(step.buffer, w.offset, w.source == 3 ? alpha : 0.0f);
            } else if (w.kind == 'i') {
                put<int32_t>(step.buffer, w.offset, 0);
            } else {
                put<uint64_t>(step.buffer, w.offset, 0);
            }
        }
        for (MapSlot& slot : step.maps) std::memcpy(step.buffer + slot.offset, maps[next_map++].data(), TENSOR_MAP_BYTES);
        if (step.has_workspace) put<uint64_t>(step.buffer, step.workspace_offset, workspaces[i]);
        step.config.stream = stream;
        failed = python->launch(&step.config, step.function, step.params.data(), nullptr);
        if (failed) what = step.what;
    }
    held.unlock();
    if (failed) TORCH_CHECK(false, "gemmgen: ", what, ": ", cuda_error(failed));
}

at::Tensor matmul_cuda(const at::Tensor& a, const at::Tensor& b, double alpha, c10::string_view precision) {
    const int64_t which = precision == "fp32" ? 0 : precision == "tf32" ? 1 : -1;
    const int64_t da = a.dim(), db = b.dim();
    if (which < 0 || da < 2 || db < 2 || da > MAX_DIMS || db > MAX_DIMS || a.scalar_type() != at::kFloat ||
        b.scalar_type() != at::kFloat || !a.is_cuda() || !b.is_cuda() || a.get_device() != b.get_device())
        return call_python(python->fallback, a, b, alpha, precision);  // Python says what is wrong
    const uint64_t pa = reinterpret_cast<uintptr_t>(a.data_ptr()), pb = reinterpret_cast<uintptr_t>(b.data_ptr());
    Key key;
    key.push(which);
    key.push(a.get_device());
    key.push(da);
    key.push(db);
    for (int64_t x : a.sizes()) key.push(x);
    for (int64_t x : b.sizes()) key.push(x);
    for (int64_t x : a.strides()) key.push(x);
    for (int64_t x : b.strides()) key.push(x);
    key.push(static_cast<int64_t>(pa & 15));
    key.push(static_cast<int64_t>(pb & 15));
    std::shared_ptr<Entry> entry;
    {
        std::lock_guard<std::mutex> guard(calls_lock);
        auto it = calls.find(key);
        if (it != calls.end()) entry = it->second;
    }
    if (!entry) {
        {
            py::gil_scoped_acquire gil;
            entry = describe(a, b, alpha, precision);
        }
        std::unordered_map<Key, std::shared_ptr<Entry>, KeyHash> dropped;  // released after the lock
        std::lock_guard<std::mutex> guard(calls_lock);
        if (calls.size() >= CALLS_KEPT) dropped.swap(calls);
        calls.emplace(key, entry);
    }
    if (entry->python_serves) return call_python(python->fallback, a, b, alpha, precision);
    at::Tensor out = at::empty(entry->shape, a.options());
    if (entry->steps.empty()) return out;  // no matrices: nothing to launch
    const uint64_t pc = reinterpret_cast<uintptr_t>(out.data_ptr());
    if (pc & 15) return call_python(python->fallback, a, b, alpha, precision);  // never from PyTorch's allocator
    void* stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
    if (entry->swap)
        launch(*entry, pb, pa, pc, static_cast<float>(alpha), stream);
    else
        launch(*entry, pa, pb, pc, static_cast<float>(alpha), stream);
    return out;
}

// --- autograd: ops.py's gradients() in C++ ----------------------------------------------------------

using MatmulOp = at::Tensor(const at::Tensor&, const at::Tensor&, double, c10::string_view);

const c10::TypedOperatorHandle<MatmulOp>& matmul_op() {
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("gemmgen::matmul", "").typed<MatmulOp>();
    return op;
}

// A matrix (or each of a batch) lying column-major, a transposed view of a row-major one: its
// gradient is made so too, as PyTorch's gradient layout contract wants (else AccumulateGrad copies it).
bool column_major(const at::Tensor& x) { return x.stride(-2) == 1 && x.stride(-1) != 1; }

// alpha * a @ b where a gradient is needed. The forward keeps only what the backward reads (grad_a
// needs b, grad_b needs a); the backward runs this operator again, through the dispatcher, so that
// it too is traced, captured and differentiated. grad_a = alpha grad b^T and grad_b = alpha a^T grad,
// each in its input's layout (a column-major one as the transposed product seen through .mT); a
// matrix b that served every batch of a (an nn.Linear weight) gets one GEMM over all of them, a's
// rows and grad's stacked; an input broadcast over batch dimensions gets its gradients summed.
struct MatmulFunction : public torch::autograd::Function<MatmulFunction> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                              double alpha, const std::string& precision) {
        at::Tensor out = matmul_op().call(a, b, alpha, precision);  // grad mode is off here
        const bool needs_a = ctx->needs_input_grad(0), needs_b = ctx->needs_input_grad(1);
        ctx->save_for_backward({needs_b ? a : at::Tensor(), needs_a ? b : at::Tensor()});
        ctx->saved_data["alpha"] = alpha;
        ctx->saved_data["precision"] = precision;
        ctx->saved_data["a_column"] = column_major(a);
        ctx->saved_data["b_column"] = column_major(b);
        ctx->saved_data["a_shape"] = a.sizes().vec();
        ctx->saved_data["b_shape"] = b.sizes().vec();
        return out;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        const auto saved = ctx->get_saved_variables();
        const at::Tensor& a = saved[0];
        const at::Tensor& b = saved[1];
        const at::Tensor& grad = grads[0];
        const double alpha = ctx->saved_data["alpha"].toDouble();
        const std::string precision = ctx->saved_data["precision"].toStringRef();
        const auto a_shape = ctx->saved_data["a_shape"].toIntVector();
        const auto b_shape = ctx->saved_data["b_shape"].toIntVector();
        auto multiply = [&](const at::Tensor& x, const at::Tensor& y) { return matmul_op().call(x, y, alpha, precision); };
        at::Tensor grad_a, grad_b;
        if (ctx->needs_input_grad(0)) {
            grad_a = ctx->saved_data["a_column"].toBool() ? multiply(b, grad.mT()).mT() : multiply(grad, b.mT());
            if (grad_a.sizes() != at::IntArrayRef(a_shape)) grad_a = grad_a.sum_to_size(a_shape);
        }
        if (ctx->needs_input_grad(1)) {
            at::Tensor x = a, g = grad;
            if (b_shape.size() == 2 && a.dim() > 2) {  // stacked: the sum over batches is one GEMM with K = batch x M
                x = a.reshape({-1, a.size(-1)});
                g = grad.reshape({-1, grad.size(-1)});
            }
            grad_b = ctx->saved_data["b_column"].toBool() ? multiply(g.mT(), x).mT() : multiply(x.mT(), g);
            if (grad_b.sizes() != at::IntArrayRef(b_shape)) grad_b = grad_b.sum_to_size(b_shape);
        }
        return {grad_a, grad_b, at::Tensor(), at::Tensor()};
    }
};

// --- gemmgen.linear's autograd: fused.py's _Linear in C++ -----------------------------------------

using LinearOp = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                            c10::string_view);

const c10::TypedOperatorHandle<LinearOp>& linear_op() {
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("gemmgen::linear", "").typed<LinearOp>();
    return op;
}

// The activations whose backward reads the output (the fused op applies them); the others' reads
// the pre-activation, which the fused op returns (bias fused) and PyTorch activates.
bool keeps_output(const std::string& activation) { return activation == "none" || activation == "relu"; }

at::Tensor activate(const at::Tensor& pre, const std::string& activation) {
    if (activation == "gelu") return at::gelu(pre, "none");
    if (activation == "gelu_tanh") return at::gelu(pre, "tanh");
    if (activation == "silu") return at::silu(pre);
    TORCH_CHECK(false, "gemmgen.linear knows no PyTorch pass for activation ", activation);
}

at::Tensor activation_backward(const at::Tensor& grad, const at::Tensor& kept, const std::string& activation) {
    if (activation == "none") return grad;
    if (activation == "relu") return at::threshold_backward(grad, kept, 0);
    if (activation == "gelu") return at::gelu_backward(grad, kept, "none");
    if (activation == "gelu_tanh") return at::gelu_backward(grad, kept, "tanh");
    if (activation == "silu") return at::silu_backward(grad, kept);
    TORCH_CHECK(false, "gemmgen.linear knows no PyTorch backward for activation ", activation);
}

// act(x @ weight^T + bias) where a gradient is needed: the forward keeps what the backward reads
// (the output for none and relu, else the pre-activation), the backward is PyTorch's activation
// backward, the bias gradient a sum over rows and the two GEMMs the matmul operator.
struct LinearFunction : public torch::autograd::Function<LinearFunction> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias, const std::string& activation,
                              const std::string& precision) {
        const bool output_kept = keeps_output(activation);
        at::Tensor kept = linear_op().call(x, weight, bias, output_kept ? activation : "none", precision);
        at::Tensor out = output_kept ? kept : activate(kept, activation);
        ctx->save_for_backward({ctx->needs_input_grad(1) ? x : at::Tensor(), ctx->needs_input_grad(0) ? weight : at::Tensor(),
                                kept});
        ctx->saved_data["activation"] = activation;
        ctx->saved_data["precision"] = precision;
        return out;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        const auto saved = ctx->get_saved_variables();
        const std::string precision = ctx->saved_data["precision"].toStringRef();
        const at::Tensor pre = activation_backward(grads[0], saved[2], ctx->saved_data["activation"].toStringRef());
        at::Tensor grad_x, grad_w, grad_b;
        if (ctx->needs_input_grad(0)) grad_x = matmul_op().call(pre, saved[1], 1.0, precision);      // (M x N) (N x K)
        if (ctx->needs_input_grad(1)) grad_w = matmul_op().call(pre.t(), saved[0], 1.0, precision);  // (N x M) (M x K)
        if (ctx->needs_input_grad(2)) grad_b = pre.sum(0);
        return {grad_x, grad_w, grad_b, at::Tensor(), at::Tensor()};
    }
};

at::Tensor linear_autograd(c10::DispatchKeySet keys, const at::Tensor& x, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::string_view activation,
                           c10::string_view precision) {
    if (at::GradMode::is_enabled() &&
        (x.requires_grad() || weight.requires_grad() || (bias.has_value() && bias->defined() && bias->requires_grad())))
        return LinearFunction::apply(x, weight, bias, std::string(activation), std::string(precision));
    at::AutoDispatchBelowAutograd below;
    return linear_op().redispatch(keys & c10::after_autograd_keyset, x, weight, bias, activation, precision);
}

at::Tensor matmul_autograd(c10::DispatchKeySet keys, const at::Tensor& a, const at::Tensor& b, double alpha,
                           c10::string_view precision) {
    if (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad()))
        return MatmulFunction::apply(a, b, alpha, std::string(precision));
    at::AutoDispatchBelowAutograd below;
    return matmul_op().redispatch(keys & c10::after_autograd_keyset, a, b, alpha, precision);
}

torch::Library* cuda_kernels = nullptr;  // registered for the process (never freed: see `calls`)
torch::Library* autograd_kernels = nullptr;

void install(py::object describe, py::object fallback, py::object error_text, uintptr_t ctx_get,
             uintptr_t ctx_set, uintptr_t launch_kernel_ex) {
    TORCH_CHECK(python == nullptr, "gemmgen: the C++ kernels are installed already");
    python = new Python{describe, fallback, error_text, reinterpret_cast<CtxGetCurrent>(ctx_get),
                        reinterpret_cast<CtxSetCurrent>(ctx_set), reinterpret_cast<LaunchKernelEx>(launch_kernel_ex)};
    cuda_kernels = new torch::Library(torch::Library::IMPL, "gemmgen", c10::DispatchKey::CUDA, __FILE__, __LINE__);
    cuda_kernels->impl("matmul", TORCH_FN(matmul_cuda));
    autograd_kernels = new torch::Library(torch::Library::IMPL, "gemmgen", c10::DispatchKey::Autograd, __FILE__,
                                          __LINE__);
    autograd_kernels->impl("matmul", TORCH_FN(matmul_autograd));
}

// gemmgen::linear's Autograd kernel, once fused.py has defined the operator (its CUDA kernel is Python).
void install_linear() {
    TORCH_CHECK(autograd_kernels != nullptr, "gemmgen: install() first");
    autograd_kernels->impl("linear", TORCH_FN(linear_autograd));
}

// gemmgen.matmul's fast path for two torch tensors into a new output (library/dispatch.py takes it
// once installed): the CUDA kernel without the dispatcher, so without autograd, as gemmgen.matmul is.
at::Tensor matmul_direct(const at::Tensor& a, const at::Tensor& b, double alpha, const std::string& precision) {
    return matmul_cuda(a, b, alpha, precision);
}

size_t keys_kept() {
    std::lock_guard<std::mutex> guard(calls_lock);
    return calls.size();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "torch.ops.gemmgen.matmul's CUDA and Autograd kernels (gemmgen/torch/native.py)";
    m.def("install", &install, "register the kernels: Python's describe, fallback and error_text, and "
          "the addresses of cuCtxGetCurrent, cuCtxSetCurrent and cuLaunchKernelEx");
    m.def("install_linear", &install_linear, "register gemmgen::linear's Autograd kernel (a C++ autograd Function)");
    m.def("matmul", &matmul_direct, "alpha * a @ b into a new tensor, by the CUDA kernel (no autograd)");
    m.def("keys_kept", &keys_kept, "how many call keys the C++ kernel keeps");
}
