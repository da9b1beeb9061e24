// WebShop, bundled: choosing an option reloads the item page with that option in the URL (as the original does),
// so the page, the Back links and the Buy Now form all carry the choice. Without JavaScript the form still works.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll('input[type="radio"][data-url]').forEach(function (radio) {
    radio.addEventListener("change", function () {
      window.location.href = radio.dataset.url;
    });
  });
});
