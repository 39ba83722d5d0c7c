// MKL's kernel choice on AVX-512 CPUs that are not Intel's (`radixkv/model/mkl_dispatch.py`).
//
// MKL picks its code path once, on its first call, and asks `mkl_serv_intel_cpu_true()` first:
// on any other vendor it takes the AVX2 kernels whatever the CPU offers. Torch links MKL into
// libtorch_cpu.so and calls that function through the library's global offset table, so
// pointing those GOT slots at a function that answers 1 lets MKL choose by the CPU's own
// feature bits (CPUID), as it does on Intel: on a 2-core AMD EPYC with AVX-512, fp32 sgemm
// 214 -> 500 GFLOP/s, and torch's flash attention, which runs on it, 2x.
//
// `radixkv_mkl_dispatch_patch(name)` rewrites every JUMP_SLOT / GLOB_DAT relocation of `name`
// in every loaded object (restoring each page's protection after the write) and returns the
// number of slots now pointing at the replacement, or -1 when one could not be written.
// `radixkv_mkl_dispatch_calls()` counts the replacement's calls: 0 after an MKL call means MKL
// had already chosen its kernels before the patch (the choice is cached for the process).

#include <link.h>
#include <elf.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int g_calls = 0;

extern "C" int radixkv_mkl_dispatch_abi(void) { return 1; }

extern "C" int radixkv_mkl_dispatch_cpu_true(void) {
  __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
  return 1;
}

extern "C" int radixkv_mkl_dispatch_calls(void) { return __atomic_load_n(&g_calls, __ATOMIC_RELAXED); }

#if defined(__x86_64__) && defined(__linux__)
namespace {

struct Patch {
  const char* name;
  void* target;
  int slots;   // slots pointing at `target` (written now or before)
  int failed;  // slots that could not be written
};

// Protection of the mapping holding `addr` (PROT_* bits), or -1.
int protection_of(uintptr_t addr) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[640];
  int prot = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && addr >= lo && addr < hi) {
      prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
             (perms[2] == 'x' ? PROT_EXEC : 0);
      break;
    }
  }
  fclose(f);
  return prot;
}

// A dynamic-section address: glibc relocates these in place on x86-64, but be safe for either.
template <class T>
const T* dyn_ptr(uintptr_t base, uintptr_t p) {
  return reinterpret_cast<const T*>(p < base ? base + p : p);
}

void patch_relocations(const dl_phdr_info* info, Patch* p, const ElfW(Rela)* rel, size_t bytes,
                       const ElfW(Sym)* symtab, const char* strtab) {
  if (rel == nullptr) return;
  const long page = sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < bytes / sizeof(ElfW(Rela)); i++) {
    const unsigned type = ELF64_R_TYPE(rel[i].r_info);
    if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
    const size_t sym = ELF64_R_SYM(rel[i].r_info);
    if (sym == 0 || strcmp(strtab + symtab[sym].st_name, p->name) != 0) continue;
    void** slot = reinterpret_cast<void**>(info->dlpi_addr + rel[i].r_offset);
    const int prot = protection_of(reinterpret_cast<uintptr_t>(slot));
    if (prot < 0) {
      p->failed++;
      continue;
    }
    void* start = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(slot) & ~static_cast<uintptr_t>(page - 1));
    const bool writable = prot & PROT_WRITE;
    if (!writable && mprotect(start, page, prot | PROT_WRITE) != 0) {
      p->failed++;
      continue;
    }
    __atomic_store_n(slot, p->target, __ATOMIC_RELEASE);
    if (!writable) mprotect(start, page, prot);  // RELRO back to read-only
    p->slots++;
  }
}

int patch_object(dl_phdr_info* info, size_t, void* data) {
  Patch* p = static_cast<Patch*>(data);
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; i++)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
  if (dyn == nullptr) return 0;
  const uintptr_t base = info->dlpi_addr;
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Rela)* jmprel = nullptr;
  const ElfW(Rela)* rela = nullptr;
  size_t jmprel_bytes = 0, rela_bytes = 0;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; d++) {
    switch (d->d_tag) {
      case DT_SYMTAB: symtab = dyn_ptr<ElfW(Sym)>(base, d->d_un.d_ptr); break;
      case DT_STRTAB: strtab = dyn_ptr<char>(base, d->d_un.d_ptr); break;
      case DT_JMPREL: jmprel = dyn_ptr<ElfW(Rela)>(base, d->d_un.d_ptr); break;
      case DT_PLTRELSZ: jmprel_bytes = d->d_un.d_val; break;
      case DT_RELA: rela = dyn_ptr<ElfW(Rela)>(base, d->d_un.d_ptr); break;
      case DT_RELASZ: rela_bytes = d->d_un.d_val; break;
      default: break;
    }
  }
  if (symtab == nullptr || strtab == nullptr) return 0;
  patch_relocations(info, p, jmprel, jmprel_bytes, symtab, strtab);
  patch_relocations(info, p, rela, rela_bytes, symtab, strtab);
  return 0;
}

}  // namespace

extern "C" int radixkv_mkl_dispatch_patch(const char* name) {
  Patch p{name, reinterpret_cast<void*>(&radixkv_mkl_dispatch_cpu_true), 0, 0};
  dl_iterate_phdr(patch_object, &p);
  return p.failed ? -1 : p.slots;
}
#else
extern "C" int radixkv_mkl_dispatch_patch(const char*) { return -1; }
#endif
