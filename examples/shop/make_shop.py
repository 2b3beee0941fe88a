"""Write the guide's example database: a small online shop as three CSV files (docs/guide/README.md).

    python examples/shop/make_shop.py [OUT_DIR]        # default: the folder of this script

Deterministic (numpy seed 52): the same files, byte for byte, on every machine. The committed CSV files are this
script's output; rerun it after editing it, and commit both.

What is in the data, so that the guide's tasks have something to learn:

- customers (400): country, segment (consumer / business), newsletter (0/1), signed_up_at (2022-11 .. 2024-10).
  Each customer has a hidden order rate and a hidden "lifetime" after which they stop ordering (churn): whether
  someone orders in the next 30 days depends on how often and how recently they ordered.
- products (50): name, category, price; static (no time column).
- orders (3,340 over 2023-2024): customer, product, ordered_at, channel, quantity, amount, status.
  amount = price x quantity, 10 % off for business customers, 20 % off in the November sale, cents rounded;
  status is "returned" more often for clothing and shoes and for customers who return a lot, "cancelled" more
  often for phone orders.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

SEED = 52
N_CUSTOMERS = 400
START, END = datetime(2023, 1, 1), datetime(2025, 1, 1)  # orders: [START, END)

COUNTRIES = ["DE", "FR", "NL", "BE", "AT", "ES"]
COUNTRY_P = [0.35, 0.2, 0.15, 0.1, 0.1, 0.1]
CATEGORIES = {  # category: (nouns, median price in euros, return rate)
    "clothing": (["shirt", "sweater", "jacket", "dress", "scarf", "hoodie", "coat", "skirt", "cardigan"], 45.0, 0.22),
    "shoes": (["sneakers", "boots", "sandals", "loafers", "slippers", "running shoes"], 80.0, 0.18),
    "home": (["lamp", "mug", "vase", "cushion", "blanket", "candle", "rug", "clock"], 30.0, 0.05),
    "kitchen": (["pan", "knife set", "kettle", "cutting board", "teapot", "bread tin"], 40.0, 0.04),
    "electronics": (["headphones", "speaker", "charger", "keyboard", "webcam", "power bank"], 90.0, 0.08),
    "garden": (["watering can", "planter", "hose", "pruning shears", "bird feeder"], 25.0, 0.03),
}
ADJECTIVES = ["linen", "oak", "ceramic", "wool", "recycled", "classic", "compact", "bamboo", "steel", "cotton",
              "vintage", "nordic", "travel", "everyday", "organic", "leather", "glass", "copper"]


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S")


def make_shop(out: Path, seed: int = SEED) -> dict[str, int]:
    """Write customers.csv, products.csv and orders.csv into `out`; returns the row counts."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)

    # products: static, 50 rows, names made of an adjective and a noun of the category
    products = []
    names: set[str] = set()
    cats = list(CATEGORIES)
    while len(products) < 50:
        cat = cats[len(products) % len(cats)]
        nouns, median, _ = CATEGORIES[cat]
        name = f"{rng.choice(ADJECTIVES)} {rng.choice(nouns)}".capitalize()
        if name in names:
            continue
        names.add(name)
        price = round(float(median * np.exp(rng.normal(0.0, 0.45))), 2)
        products.append((len(products) + 1, name, cat, price))
    popularity = rng.gamma(1.2, 1.0, len(products))
    popularity /= popularity.sum()

    # customers: sign-ups spread over two years, a hidden order rate (orders a month) and lifetime
    days = (datetime(2024, 11, 1) - datetime(2022, 11, 1)).days
    customers = []
    hidden = []
    for cid in range(1, N_CUSTOMERS + 1):
        signed = datetime(2022, 11, 1) + timedelta(days=int(rng.integers(days)), seconds=int(rng.integers(86400)))
        country = str(rng.choice(COUNTRIES, p=COUNTRY_P))
        segment = "business" if rng.random() < 0.15 else "consumer"
        newsletter = int(rng.random() < 0.4)
        rate = rng.gamma(2.0, 0.45) * (1.4 if newsletter else 1.0) * (1.5 if segment == "business" else 1.0)
        lifetime = timedelta(days=float(rng.exponential(330.0)))
        returner = rng.beta(1.0, 6.0)  # the customer's own habit of returning things
        customers.append((cid, country, segment, newsletter, signed))
        hidden.append((rate, signed + lifetime, returner))

    # orders: a Poisson process per customer between sign-up and churn, busier in December, lazier in summer
    season = {12: 1.6, 11: 1.3, 7: 0.7, 8: 0.7}
    raw = []
    for (cid, _country, segment, _nl, signed), (rate, churn, returner) in zip(customers, hidden, strict=True):
        t = max(signed, START)
        stop = min(churn, END)
        while True:
            t = t + timedelta(days=float(rng.exponential(30.0 / (rate * season.get(t.month, 1.0)))))
            if t >= stop:
                break
            pid = int(rng.choice(len(products), p=popularity)) + 1
            _, _, cat, price = products[pid - 1]
            channel = str(rng.choice(["web", "app", "phone"], p=[0.55, 0.35, 0.10]))
            quantity = int(1 + rng.poisson(1.5 if segment == "business" else 0.4))
            factor = (0.9 if segment == "business" else 1.0) * (0.8 if t.month == 11 else 1.0)
            amount = round(price * quantity * factor, 2)
            p_cancel = 0.02 + (0.08 if channel == "phone" else 0.0)
            p_return = min(0.9, CATEGORIES[cat][2] + returner * 0.6)
            u = rng.random()
            status = "cancelled" if u < p_cancel else "returned" if u < p_cancel + p_return else "delivered"
            raw.append((t.replace(microsecond=0), cid, pid, channel, quantity, amount, status))
    raw.sort(key=lambda r: (r[0], r[1]))

    with open(out / "products.csv", "w", newline="") as f:
        f.write("product_id,name,category,price\n")
        for pid, name, cat, price in products:
            f.write(f"{pid},{name},{cat},{price:.2f}\n")
    with open(out / "customers.csv", "w", newline="") as f:
        f.write("customer_id,country,segment,newsletter,signed_up_at\n")
        for cid, country, segment, newsletter, signed in customers:
            f.write(f"{cid},{country},{segment},{newsletter},{_ts(signed)}\n")
    with open(out / "orders.csv", "w", newline="") as f:
        f.write("order_id,customer_id,product_id,ordered_at,channel,quantity,amount,status\n")
        for oid, (t, cid, pid, channel, quantity, amount, status) in enumerate(raw, start=1):
            f.write(f"{oid},{cid},{pid},{_ts(t)},{channel},{quantity},{amount:.2f},{status}\n")
    return {"customers": len(customers), "products": len(products), "orders": len(raw)}


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    counts = make_shop(target)
    print(", ".join(f"{n} {t}" for t, n in counts.items()), "written to", target)
