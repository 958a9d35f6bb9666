-- 0039: a placeholder for the migration reserved under this number, which lands on another
-- branch; versions must have no gap, so 0040 needs one here. Drop this file when the real
-- 0039 is merged.
SELECT 1;
