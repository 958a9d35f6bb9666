-- 0026: a placeholder on this branch only, so that 0027 applies in order; drop it when
-- merging, where another change brings 0026.
SELECT 1;
