//! Memory sizes as users write them: plain bytes, "8GiB", "8g", "8192m" (HAMi's forms).
