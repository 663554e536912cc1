//! Context-local storage: the CUDA runtime keeps its per-context state in the driver under
//! keys of its own (a private table, see `fakegpu-cuda`'s export tables). Entries belong to
//! a context and go with it (destroy, last primary release, reset); the destructor callback
//! the runtime registers is not called.

use super::{Cuda, R};
use gpuslice_abi::cuda::result::*;

impl Cuda {
    /// A null context means the current one.
    fn storage_ctx(&self, ctx: u64) -> R<u64> {
        if ctx == 0 {
            return Ok(self.current()?.ctx);
        }
        self.check()?;
        Self::live_ctx(&self.lock(), ctx).map(|c| c.ctx)
    }

    pub fn ctx_storage_put(&self, ctx: u64, key: usize, value: usize) -> R<()> {
        let ctx = self.storage_ctx(ctx)?;
        self.lock().ctx_storage.insert((ctx, key), value);
        Ok(())
    }

    pub fn ctx_storage_delete(&self, ctx: u64, key: usize) -> R<()> {
        let ctx = self.storage_ctx(ctx)?;
        self.lock().ctx_storage.remove(&(ctx, key));
        Ok(())
    }

    /// CUDA_ERROR_INVALID_HANDLE when nothing is stored under the key.
    pub fn ctx_storage_get(&self, ctx: u64, key: usize) -> R<usize> {
        let ctx = self.storage_ctx(ctx)?;
        self.lock()
            .ctx_storage
            .get(&(ctx, key))
            .copied()
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    #[test]
    fn storage_follows_the_context() {
        let c = driver(small_overhead());
        assert_eq!(c.ctx_storage_put(0, 1, 2), Err(CUDA_ERROR_INVALID_CONTEXT));
        let p = c.primary_peek(0).unwrap();
        assert_eq!(
            c.primary_state(0).unwrap(),
            (0, false),
            "peek does not activate"
        );
        assert_eq!(c.ctx_storage_put(p, 1, 2), Err(CUDA_ERROR_INVALID_CONTEXT));
        assert_eq!(c.primary_retain(0).unwrap(), p);
        c.ctx_storage_put(p, 1, 2).unwrap();
        assert_eq!(c.ctx_storage_get(p, 1), Ok(2));
        assert_eq!(c.ctx_storage_get(p, 9), Err(CUDA_ERROR_INVALID_HANDLE));
        c.ctx_set_current(p).unwrap();
        assert_eq!(
            c.ctx_storage_get(0, 1),
            Ok(2),
            "null is the current context"
        );
        c.ctx_storage_delete(0, 1).unwrap();
        assert_eq!(c.ctx_storage_get(p, 1), Err(CUDA_ERROR_INVALID_HANDLE));
        c.ctx_storage_put(p, 1, 3).unwrap();
        c.primary_reset(0).unwrap();
        c.primary_retain(0).unwrap();
        assert_eq!(
            c.ctx_storage_get(p, 1),
            Err(CUDA_ERROR_INVALID_HANDLE),
            "reset drops it"
        );
    }
}
