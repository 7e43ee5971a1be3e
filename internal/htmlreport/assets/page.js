// nixlctl report page: legend buttons toggle their series. The page is
// whole without it (every value is in the markup and its tooltips); this
// only hides and shows.
(function () {
  "use strict";
  document.querySelectorAll(".legend button[data-target]").forEach(function (btn) {
    btn.addEventListener("click", function () {
      var off = btn.classList.toggle("off");
      btn.setAttribute("aria-pressed", off ? "false" : "true");
      document.querySelectorAll('[data-series="' + btn.getAttribute("data-target") + '"]').forEach(function (el) {
        el.classList.toggle("off", off);
      });
    });
  });
  // Read by the browser test: the script ran to its end without an error.
  document.body.setAttribute("data-script", "ran");
})();
