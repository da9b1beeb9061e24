"""The vocabulary the procedural catalog draws from: five top categories as in the original WebShop (beauty,
electronics, fashion, food, furniture), product types with their category path, search query, title nouns,
attribute pool, option names and values, and price band, plus brands and text templates.

Attribute phrases are the kind the original's ``instruction_attributes`` hold ("long lasting", "machine wash",
"gluten free"); option values are lower-case like the original's (it lower-cases and replaces ``/`` by `` | ``).
"""

from __future__ import annotations

from dataclasses import dataclass

COLORS = (
    "black", "white", "navy", "grey", "charcoal", "beige", "brown", "khaki", "olive", "army green", "red", "wine red",
    "burgundy", "pink", "light pink", "hot pink", "purple", "lavender", "blue", "light blue", "royal blue", "sky blue",
    "teal", "green", "mint green", "yellow", "mustard", "orange", "coral", "ivory", "cream", "silver", "gold",
    "rose gold", "multicolor", "leopard", "camo", "deep atlantic", "heather grey", "black | white", "white | blue",
)  # fmt: skip
APPAREL_SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large", "3x-large", "4x-large")
TALL_SIZES = ("large tall", "x-large tall", "xx-large big tall", "3x-large big")
SHOE_SIZES = tuple(f"{s:g}" for s in (5, 5.5, 6, 6.5, 7, 7.5, 8, 8.5, 9, 9.5, 10, 10.5, 11, 12, 13))
PACKS = ("1 count (pack of 1)", "2 count (pack of 2)", "3 count (pack of 3)", "pack of 4", "pack of 6", "pack of 12")
OUNCES = ("1.7 ounce", "3.4 fl oz", "4 ounce", "8 ounce (pack of 1)", "12 ounce", "16 ounce (pack of 2)", "2 pound")
FLAVORS = (
    "chocolate", "dark chocolate", "vanilla", "strawberry", "peanut butter", "sea salt", "original", "honey",
    "cinnamon", "mixed berry", "lemon", "mint", "caramel", "coconut", "salted caramel", "cookies and cream",
)  # fmt: skip
SCENTS = ("unscented", "lavender", "fresh linen", "citrus", "coconut", "vanilla", "sandalwood", "rose", "eucalyptus")
SHADES = ("fair", "light", "light medium", "medium", "tan", "deep", "01 ivory", "02 natural beige", "03 warm sand")
WOOD = ("natural", "walnut", "espresso", "white oak", "black", "grey wash", "rustic brown", "cherry")
FURNITURE_SIZE = ("24 inch", "30 inch", "36 inch", "40 x 30 inch", "47 inch", "55 inch", "60 x 24 inch", "twin",
                  "full", "queen", "king")  # fmt: skip
CAPACITY = ("32gb", "64gb", "128gb", "256gb", "512gb", "1tb", "2tb")
CABLE_LEN = ("3 ft", "6 ft", "10 ft", "2 pack 6 ft", "3 pack mixed")
STYLES = ("style a", "style b", "classic", "modern", "vintage", "sport")
HAIR_LEN = ("14 inch", "16 inch", "18 inch", "20 inch", "22 inch", "24 inch")


@dataclass(frozen=True)
class ProductType:
    """One kind of product: how it is filed, searched for, named, described, optioned and priced."""

    category: str
    path: str  # product_category, levels joined by " › "
    query: str
    nouns: tuple[str, ...]  # title head nouns (singular, Title Case)
    modifiers: tuple[str, ...]  # title words before the noun
    attributes: tuple[str, ...]  # attribute phrases (goal attributes are drawn from the product's)
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (option name, value pool)
    price: tuple[float, float]
    materials: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()


def _t(category, path, query, nouns, modifiers, attributes, options, price, materials=(), uses=()) -> ProductType:
    return ProductType(category, path, query, tuple(nouns), tuple(modifiers), tuple(attributes), tuple(options),
                       price, tuple(materials), tuple(uses))  # fmt: skip


PRODUCT_TYPES: tuple[ProductType, ...] = (
    # ------------------------------------------------------------------ beauty
    _t("beauty", "Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & Accessories › Extensions",
       "hair extensions", ["Hair Extensions", "Clip in Hair Extension", "Ponytail Extension"],
       ["Long", "Straight", "Wavy", "Curly", "Thick", "Seamless", "Invisible"],
       ["natural looking", "human hair", "easy to apply", "heat resistant", "long lasting", "high quality",
        "natural hair", "tangle free"], [("color", COLORS[:12]), ("size", HAIR_LEN)], (12, 90),
       ["synthetic fiber", "remy human hair"], ["daily wear", "parties", "cosplay"]),
    _t("beauty", "Beauty & Personal Care › Makeup › Eyes › Eyeshadow", "eyeshadow palette",
       ["Eyeshadow Palette", "Eye Shadow Palette", "Eyeshadow Stick"],
       ["Matte", "Shimmer", "Glitter", "Nude", "Smokey", "Highly Pigmented", "Waterproof"],
       ["long lasting", "cruelty free", "highly pigmented", "easy to blend", "paraben free", "travel size",
        "waterproof", "vegan"], [("color", ("01 nude", "02 smokey", "03 sunset", "04 rose gold", "05 galaxy"))],
       (5, 45), ["pressed powder", "mineral pigments"], ["everyday makeup", "party looks"]),
    _t("beauty", "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers › Face Moisturizers",
       "face moisturizer", ["Face Moisturizer", "Night Cream", "Day Cream", "Facial Lotion"],
       ["Hydrating", "Anti Aging", "Oil Free", "Lightweight", "Firming", "Brightening"],
       ["anti aging", "hyaluronic acid", "fine lines", "dry skin", "sensitive skin", "fragrance free",
        "paraben free", "natural ingredients", "cruelty free"], [("size", OUNCES[:5]), ("scent", SCENTS[:4])],
       (8, 70), ["hyaluronic acid", "vitamin c", "retinol"], ["dry skin", "combination skin"]),
    _t("beauty", "Beauty & Personal Care › Oral Care › Toothbrushes & Accessories › Electric Toothbrushes",
       "electric toothbrush", ["Electric Toothbrush", "Sonic Toothbrush", "Toothbrush Heads"],
       ["Rechargeable", "Sonic", "Travel", "Whitening", "Soft"],
       ["long lasting", "easy to use", "travel case", "sensitive teeth", "rechargeable battery", "bpa free",
        "high quality"], [("color", ("white", "black", "pink", "blue", "mint green")), ("size", PACKS[:4])],
       (15, 120), ["nylon bristles"], ["adults", "kids", "sensitive gums"]),
    _t("beauty", "Beauty & Personal Care › Personal Care › Deodorants & Antiperspirants › Deodorant",
       "deodorant", ["Deodorant", "Natural Deodorant", "Deodorant Stick"],
       ["Aluminum Free", "Natural", "Clinical Strength", "Fresh", "Sensitive"],
       ["aluminum free", "long lasting", "paraben free", "cruelty free", "sensitive skin", "natural ingredients",
        "baking soda free"], [("scent", SCENTS), ("size", PACKS[:4])], (5, 30), ["coconut oil", "shea butter"],
       ["men", "women", "daily use"]),
    _t("beauty", "Beauty & Personal Care › Tools & Accessories › Nail Tools › Nail Polish",
       "nail polish", ["Nail Polish", "Gel Nail Polish", "Nail Polish Set"],
       ["Quick Dry", "Glossy", "Long Wear", "Soak Off", "Glitter"],
       ["long lasting", "quick drying", "non toxic", "easy to apply", "high gloss", "nail art", "cruelty free"],
       [("color", COLORS[10:28])], (4, 35), ["uv gel"], ["home manicure", "salon"]),
    # ------------------------------------------------------------------ electronics
    _t("electronics", "Electronics › Headphones, Earbuds & Accessories › Headphones & Earbuds › Earbud Headphones",
       "wireless earbuds", ["Wireless Earbuds", "Bluetooth Earbuds", "Sports Headphones"],
       ["True Wireless", "Noise Cancelling", "Waterproof", "Bluetooth 5.3", "Sport"],
       ["noise cancelling", "long battery life", "waterproof", "fast charging", "hands free", "easy to use",
        "high definition", "charging case"], [("color", ("black", "white", "navy", "rose gold", "silver", "red"))],
       (15, 180), ["abs plastic"], ["running", "workouts", "calls"]),
    _t("electronics", "Electronics › Computers & Accessories › Data Storage › USB Flash Drives",
       "usb flash drive", ["USB Flash Drive", "Thumb Drive", "Memory Stick"],
       ["High Speed", "USB 3.0", "Dual", "Metal", "Mini"],
       ["high speed", "plug and play", "usb 3.0", "easy to carry", "metal case", "dual connector", "data backup"],
       [("size", CAPACITY[:5]), ("color", ("silver", "black", "blue", "gold"))], (6, 60), ["zinc alloy"],
       ["photos", "files", "laptops"]),
    _t("electronics", "Electronics › Television & Video › Accessories › TV Mounts, Stands & Turntables",
       "tv wall mount", ["TV Wall Mount", "TV Mount", "Full Motion TV Bracket"],
       ["Full Motion", "Tilting", "Low Profile", "Heavy Duty", "Swivel"],
       ["heavy duty", "easy install", "full motion", "space saving", "cable management", "stainless steel",
        "wall mount"], [("size", ("26-55 inch", "32-65 inch", "37-75 inch", "42-85 inch"))], (18, 110),
       ["cold rolled steel"], ["living room", "bedroom", "office"]),
    _t("electronics", "Electronics › Computers & Accessories › Computer Accessories › Cables › USB Cables",
       "usb c charging cable", ["USB C Cable", "Charging Cable", "Fast Charger Cable"],
       ["Braided", "Fast Charging", "Right Angle", "Durable", "Short"],
       ["fast charging", "high speed", "nylon braided", "data transfer", "durable", "tangle free",
        "universal compatibility"], [("size", CABLE_LEN), ("color", ("black", "white", "grey", "red", "blue"))],
       (5, 30), ["nylon braided"], ["phones", "tablets", "laptops"]),
    _t("electronics", "Electronics › Camera & Photo › Tripods & Monopods › Tripods", "camera tripod",
       ["Camera Tripod", "Phone Tripod", "Selfie Stick Tripod"],
       ["Lightweight", "Aluminum", "Extendable", "Travel", "Compact"],
       ["lightweight", "easy carry", "remote control", "height adjustable", "aluminum alloy", "carrying bag",
        "quick release"], [("size", ("40 inch", "50 inch", "60 inch", "67 inch", "74 inch"))], (15, 120),
       ["aluminum alloy"], ["travel", "vlogging", "photography"]),
    _t("electronics", "Electronics › Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
       "bluetooth speaker", ["Bluetooth Speaker", "Portable Speaker", "Wireless Speaker"],
       ["Portable", "Waterproof", "Loud", "Mini", "Outdoor"],
       ["long battery life", "waterproof", "stereo sound", "built in microphone", "easy carry", "deep bass",
        "high definition"], [("color", ("black", "blue", "red", "grey", "camo", "teal"))], (18, 150),
       ["fabric grille"], ["outdoors", "parties", "showers"]),
    # ------------------------------------------------------------------ fashion
    _t("fashion", "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › Dress Shirts", "men's dress shirts",
       ["Dress Shirt", "Button Down Shirt", "Oxford Shirt"],
       ["Men's", "Slim Fit", "Regular Fit", "Long Sleeve", "Short Sleeve", "Wrinkle Free"],
       ["machine wash", "classic fit", "long sleeve", "short sleeve", "cotton spandex", "button closure",
        "wrinkle free", "slim fit"], [("color", COLORS), ("size", APPAREL_SIZES + TALL_SIZES)], (12, 75),
       ["cotton", "cotton spandex", "polyester"], ["work", "weddings", "business casual"]),
    _t("fashion", "Clothing, Shoes & Jewelry › Women › Clothing › Dresses › Casual", "women's summer dresses",
       ["Summer Dress", "Maxi Dress", "Sundress", "Midi Dress"],
       ["Women's", "Floral", "Boho", "Casual", "V Neck", "Sleeveless", "Loose"],
       ["machine wash", "hand wash", "loose fit", "short sleeve", "sleeveless", "elastic waist", "polyester spandex",
        "daily wear"], [("color", COLORS), ("size", APPAREL_SIZES)], (15, 60), ["polyester", "rayon"],
       ["beach", "vacation", "daily wear"]),
    _t("fashion", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running", "men's running shoes",
       ["Running Shoes", "Walking Shoes", "Sneakers", "Trail Running Shoe"],
       ["Men's", "Lightweight", "Breathable", "Non Slip", "Cushioned", "Athletic"],
       ["rubber sole", "non slip", "lightweight", "arch support", "breathable", "memory foam", "lace up"],
       [("color", COLORS[:20]), ("size", SHOE_SIZES)], (25, 140), ["mesh", "knit"], ["gym", "jogging", "walking"]),
    _t("fashion", "Clothing, Shoes & Jewelry › Women › Shoes › Sandals › Flat Sandals", "women's sandals",
       ["Flat Sandals", "Slide Sandals", "Flip Flops", "Wedge Sandals"],
       ["Women's", "Comfortable", "Summer", "Open Toe", "Strappy"],
       ["rubber sole", "open toe", "arch support", "non slip", "ankle strap", "soft footbed", "memory foam"],
       [("color", COLORS[:16]), ("size", SHOE_SIZES[:11])], (12, 80), ["faux leather", "eva"],
       ["beach", "summer", "vacation"]),
    _t("fashion", "Clothing, Shoes & Jewelry › Women › Jewelry › Necklaces › Pendants", "necklace for women",
       ["Pendant Necklace", "Necklace", "Choker Necklace", "Layered Necklace"],
       ["Dainty", "Sterling Silver", "Gold Plated", "Heart", "Minimalist"],
       ["sterling silver", "gold plated", "hypoallergenic", "gift box", "nickel free", "adjustable chain",
        "birthday gift"], [("color", ("silver", "gold", "rose gold")), ("size", ("16 inch", "18 inch", "20 inch"))],
       (10, 90), ["925 sterling silver", "cubic zirconia"], ["birthdays", "anniversaries", "daily wear"]),
    _t("fashion", "Clothing, Shoes & Jewelry › Men › Clothing › Active › Active Shorts", "men's workout shorts",
       ["Workout Shorts", "Running Shorts", "Gym Shorts"],
       ["Men's", "Quick Dry", "Athletic", "Lightweight", "Zipper Pocket"],
       ["quick dry", "drawstring closure", "elastic waist", "machine wash", "zipper pockets", "moisture wicking",
        "polyester spandex"], [("color", COLORS[:14]), ("size", APPAREL_SIZES)], (10, 45), ["polyester"],
       ["running", "gym", "training"]),
    # ------------------------------------------------------------------ food
    _t("food", "Grocery & Gourmet Food › Snacks & Sweets › Snack Food Bars › Protein Bars", "protein bars",
       ["Protein Bars", "Snack Bars", "Energy Bars"], ["High Protein", "Low Sugar", "Keto", "Plant Based", "Chewy"],
       ["gluten free", "low sugar", "high protein", "non gmo", "plant based", "keto friendly", "individually wrapped",
        "low carb"], [("flavor name", FLAVORS[:10]), ("size", PACKS)], (10, 60), ["whey protein", "almonds"],
       ["snacking", "after workouts", "breakfast"]),
    _t("food", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Whole Coffee Beans",
       "whole bean coffee", ["Whole Bean Coffee", "Coffee Beans", "Ground Coffee"],
       ["Medium Roast", "Dark Roast", "Light Roast", "Organic", "Single Origin"],
       ["usda organic", "fair trade", "medium roast", "dark roast", "non gmo", "kosher certified", "100% arabica"],
       [("flavor name", ("original", "french roast", "colombian", "breakfast blend", "decaf", "hazelnut")),
        ("size", ("12 ounce", "2 pound", "32 ounce", "5 pound"))], (9, 55), ["arabica beans"],
       ["espresso", "drip coffee", "cold brew"]),
    _t("food", "Grocery & Gourmet Food › Pantry Staples › Cooking & Baking › Nut Butters › Peanut Butter",
       "peanut butter", ["Peanut Butter", "Almond Butter", "Nut Butter Spread"],
       ["Creamy", "Crunchy", "Natural", "Organic", "Unsalted"],
       ["gluten free", "non gmo", "no added sugar", "plant based", "high protein", "usda organic", "keto friendly"],
       [("flavor name", ("creamy", "crunchy", "honey roasted", "unsalted", "chocolate")), ("size", OUNCES[2:])],
       (5, 35), ["dry roasted peanuts"], ["sandwiches", "smoothies", "baking"]),
    _t("food", "Grocery & Gourmet Food › Snacks & Sweets › Candy & Chocolate › Chocolate", "dark chocolate",
       ["Dark Chocolate Bar", "Chocolate Bar", "Chocolate Truffles"],
       ["Dark", "Milk", "Sugar Free", "Belgian", "Artisan"],
       ["sugar free", "gluten free", "non gmo", "fair trade", "individually wrapped", "gift box", "kosher certified"],
       [("flavor name", ("dark chocolate", "sea salt", "mint", "raspberry", "almond", "orange")),
        ("size", PACKS)], (6, 50), ["cocoa beans"], ["gifts", "holidays", "snacking"]),
    _t("food", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green Tea", "green tea bags",
       ["Green Tea", "Herbal Tea", "Matcha Tea", "Tea Bags"], ["Organic", "Decaf", "Loose Leaf", "Japanese"],
       ["usda organic", "caffeine free", "non gmo", "gluten free", "individually wrapped", "kosher certified",
        "natural ingredients"], [("flavor name", ("jasmine", "peppermint", "lemon", "ginger", "matcha", "honey")),
                                 ("size", ("20 count", "40 count", "100 count", "pack of 6"))], (5, 40),
       ["green tea leaves"], ["relaxing", "mornings"]),
    _t("food", "Grocery & Gourmet Food › Pantry Staples › Dried Beans, Grains & Rice › Rice", "rice",
       ["Jasmine Rice", "Basmati Rice", "Brown Rice", "Rice"], ["Long Grain", "Organic", "Aged", "Premium"],
       ["gluten free", "non gmo", "usda organic", "kosher certified", "low fat", "easy prepare"],
       [("size", ("2 pound", "5 pound", "10 pound", "15 pound", "pack of 6"))], (4, 45), ["long grain rice"],
       ["dinners", "meal prep"]),
    # ------------------------------------------------------------------ furniture
    _t("furniture", "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables", "coffee table",
       ["Coffee Table", "Lift Top Coffee Table", "Round Coffee Table"],
       ["Modern", "Rustic", "Mid Century", "Industrial", "Farmhouse"],
       ["easy assemble", "storage space", "solid wood", "living room", "metal frame", "space saving",
        "high gloss"], [("color", WOOD), ("size", FURNITURE_SIZE[:7])], (60, 420), ["engineered wood", "solid wood"],
       ["living room", "apartments"]),
    _t("furniture", "Home & Kitchen › Furniture › Bedroom Furniture › Beds, Frames & Bases › Beds", "bed frame",
       ["Bed Frame", "Platform Bed", "Upholstered Bed"], ["Metal", "Wooden", "Upholstered", "Heavy Duty", "Low"],
       ["easy assemble", "storage space", "heavy duty", "no box spring needed", "noise free", "solid wood",
        "metal frame"], [("color", WOOD + ("grey", "beige")), ("size", FURNITURE_SIZE[7:])], (90, 700),
       ["steel", "pine wood", "linen fabric"], ["bedroom", "guest room"]),
    _t("furniture", "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs › Desk Chairs",
       "office chair", ["Office Chair", "Desk Chair", "Gaming Chair", "Ergonomic Chair"],
       ["Ergonomic", "Mesh", "High Back", "Swivel", "Adjustable"],
       ["lumbar support", "height adjustable", "easy assemble", "high back", "breathable mesh", "heavy duty",
        "padded armrests"], [("color", ("black", "grey", "white", "blue", "pink", "brown"))], (50, 380),
       ["mesh", "pu leather"], ["home office", "gaming", "study"]),
    _t("furniture", "Home & Kitchen › Furniture › Living Room Furniture › Bookcases", "bookshelf",
       ["Bookshelf", "Bookcase", "Ladder Shelf", "Storage Shelf"], ["5 Tier", "Industrial", "Tall", "Corner"],
       ["easy assemble", "storage space", "metal frame", "space saving", "solid wood", "living room",
        "display shelves"], [("color", WOOD), ("size", ("3 tier", "4 tier", "5 tier", "6 tier"))], (35, 260),
       ["particleboard", "steel frame"], ["living room", "office", "kids room"]),
    _t("furniture", "Home & Kitchen › Furniture › Living Room Furniture › Ottomans", "storage ottoman",
       ["Storage Ottoman", "Ottoman Bench", "Foot Stool"], ["Velvet", "Folding", "Round", "Tufted", "Linen"],
       ["storage space", "living room", "easy assemble", "faux leather", "solid wood", "foldable",
        "high density foam"], [("color", ("grey", "beige", "navy", "black", "green", "pink", "brown")),
                               ("size", ("small", "medium", "large", "30 inch", "45 inch"))], (25, 180),
       ["velvet", "linen", "faux leather"], ["living room", "entryway", "bedroom"]),
    _t("furniture", "Home & Kitchen › Furniture › Kitchen & Dining Room Furniture › Chairs", "dining chairs",
       ["Dining Chairs", "Kitchen Chairs", "Bar Stools"], ["Set of 2", "Set of 4", "Modern", "Upholstered"],
       ["easy assemble", "metal legs", "solid wood", "dining room", "high density foam", "faux leather",
        "living room"], [("color", ("black", "white", "grey", "beige", "green", "walnut")),
                         ("size", ("set of 2", "set of 4", "set of 6"))], (60, 450),
       ["beech wood", "velvet", "pu leather"], ["kitchen", "dining room"]),
)  # fmt: skip

CATEGORIES: tuple[str, ...] = ("beauty", "electronics", "fashion", "food", "furniture")

BRAND_STEMS = (
    "Nord", "Vela", "Kest", "Aur", "Lumi", "Bryn", "Cor", "Dex", "Elm", "Fay", "Gale", "Hal", "Iso", "Jun", "Kai",
    "Lark", "Mav", "Nix", "Oak", "Pell", "Quin", "Riv", "Sol", "Tor", "Uma", "Vox", "Wren", "Yar", "Zen", "Ash",
    "Bel", "Cal", "Dun", "Ever", "Fern", "Glo", "Hart", "Ivo", "Jas", "Kol",
)  # fmt: skip
BRAND_ENDS = ("ia", "ex", "ora", "vik", "ly", "ton", "ix", "era", "wood", "mark", "sen", "go", "ary", "ion", "ova")

DESCRIPTION_TEMPLATES = (
    "The {brand} {noun} is made for {use}.",
    "Made from {material}, with {attr1} and {attr2} in mind.",
    "Designed with care ({attr1}) so you can enjoy it every day.",
    "Perfect for {use} and {use2}, it makes a thoughtful gift.",
    "Our {noun} stands out for {attr2} quality that lasts.",
    "Customers choose {brand} for {attr1} at a fair price.",
    "Satisfaction guaranteed: if you are not happy, contact us for a replacement or refund.",
)
BULLET_TEMPLATES = (
    "{ATTR1}: the {brand} {noun} is built around {attr1} and tested for everyday use",
    "PREMIUM MATERIAL: made of {material}, {attr2}",
    "GREAT FOR {USE}: ideal for {use} and {use2}",
    "{ATTR3}: a {attr3} design you can rely on",
    "WHAT YOU GET: 1 x {noun}, friendly customer service and a 30-day return window",
)
REVIEW_TITLES = ("Love it", "Great value", "As described", "Not bad", "Would buy again", "Disappointed",
                 "Exactly what I needed", "Okay for the price")  # fmt: skip
REVIEW_BODIES = (
    "Works well for {use}. The {noun} is {attr1} as promised.",
    "Arrived quickly and looks just like the pictures.",
    "Quality is fine but the sizing runs a little small.",
    "I bought this for {use} and it has held up nicely.",
    "Not quite what I hoped for {use}, but it does the job.",
)
