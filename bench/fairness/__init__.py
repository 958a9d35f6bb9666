"""Fair shares across keys: quiet tenants' waits beside a flood, shares against weights, and
what the fair claim costs at depth."""
