-- 0003: reserved for another branch of issue 5. This placeholder only keeps the numbering
-- gapless on the `periodic` branch; drop it when the real 0003 is merged.
SELECT 1;
