//! The real driver as the shim calls it: one lazily resolved slot per function of the
//! registry's table (`hooks::registry`: every hooked function, then every helper), its C
//! signature, and a typed accessor. Generated from that one table by `real_table!` below; the
//! handlers the table names are ignored here, so the policy layer and the rest of the ground
//! can call the real driver without depending on the hook layer.

use std::ffi::{c_char, c_int, c_uint, c_void};

use gpuslice_abi::cuda::*;
use gpuslice_abi::nvml::*;

use super::real::{Library, RealSlot};

macro_rules! real_table {
    (
        hooks {
            $( $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty
                => $($handler:ident)::+ $([$flag:ident])? ; )*
        }
        helpers {
            $( $hlib:ident fn $hname:ident ( $($hty:ty),* $(,)? ) -> $hret:ty ; )*
        }
    ) => {
        /// Position of each function in [`SLOTS`]: hooks first, then helpers.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum SlotId { $($name,)* $($hname,)* }

        pub const HOOK_COUNT: usize = [$(stringify!($name)),*].len();
        pub const SLOT_COUNT: usize = HOOK_COUNT + [$(stringify!($hname)),*].len();

        /// The real functions, hooks first (same order as the registry's `HOOKS`), then helpers.
        pub static SLOTS: [RealSlot; SLOT_COUNT] = [
            $( RealSlot::new(Library::$lib, concat!(stringify!($name), "\0").as_bytes()), )*
            $( RealSlot::new(Library::$hlib, concat!(stringify!($hname), "\0").as_bytes()), )*
        ];

        /// C signatures of the real functions (and of our exports).
        #[allow(non_camel_case_types)]
        pub mod signature {
            use super::*;
            $( pub type $name = unsafe extern "C" fn($($ty),*) -> $ret; )*
            $( pub type $hname = unsafe extern "C" fn($($hty),*) -> $hret; )*
        }

        /// Typed access to the real functions; `None` = the real library lacks it.
        #[allow(non_snake_case)]
        pub mod real {
            use super::*;
            $(
                #[inline]
                pub fn $name() -> Option<signature::$name> {
                    let pointer = SLOTS[SlotId::$name as usize].get()?;
                    // SAFETY: the slot holds what the real library exports under this name,
                    // whose C signature is the declared one.
                    Some(unsafe { std::mem::transmute::<*mut c_void, signature::$name>(pointer) })
                }
            )*
            $(
                #[inline]
                pub fn $hname() -> Option<signature::$hname> {
                    let pointer = SLOTS[SlotId::$hname as usize].get()?;
                    // SAFETY: as above, for a helper.
                    Some(unsafe { std::mem::transmute::<*mut c_void, signature::$hname>(pointer) })
                }
            )*
        }
    };
}

hook_table!(real_table);
